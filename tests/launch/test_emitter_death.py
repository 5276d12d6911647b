"""A dead or stopped emitter is admitted: the trainer records what it handed over, and the account and
``traceml analyze`` name the rank and the steps that never reached the local copy (issue 21).

The 20,000-step runs (SIGKILL at ~3,000; SIGSTOP for 60 s across the exit) are
``benchmarks/emitter_death.py``; these are the short variants.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.launch.test_traceml_run import REPO, _env, _only_run_dir
from traceml_otel import contract as c
from traceml_otel.wire.export_stats import read_export_stats

FAULT = REPO / "tests" / "launch" / "scripts" / "emitter_fault.py"


def _run(tmp_path: Path, *arguments: str, **env: str) -> subprocess.CompletedProcess:
    """``traceml run`` with its output in files: a stopped emitter keeps the inherited pipes open."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run(
            [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", str(FAULT), "--", *arguments],
            env=_env(tmp_path, **env), stdout=stdout, stderr=stderr, timeout=120,
        ).returncode
    return subprocess.CompletedProcess([], code, out.read_text(), err.read_text())


def _analyze(run_dir: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_a_killed_emitter_is_named_with_the_steps_it_never_wrote(tmp_path: Path) -> None:
    result = _run(tmp_path, "--steps", "800", "--at", "200", "--action", "kill")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    run_dir = _only_run_dir(tmp_path)
    handoff = json.loads((run_dir / c.handoff_file_name(0)).read_text())
    assert handoff["steps_traced"] == 800 and handoff["emitter"] == "died (killed by SIGKILL)"
    (stats,) = read_export_stats(run_dir).stats
    written = stats.steps_local
    assert 0 < written <= 201  # the periodic counts reached the file before the kill
    missing = f"{800 - written:,} of 800 traced steps not written"
    account = re.search(r"rank 0: telemetry process died \(killed by SIGKILL\) at step ~(\d+); (.*)",
                        result.stdout)
    assert account and int(account[1]) == written and missing in account[2], result.stdout
    assert f"local copy holds {written} of 800 traced steps (INCOMPLETE)" in result.stdout
    report = _analyze(run_dir)
    assert "TELEMETRY DEGRADED [warning] - rank 0" in report and "killed by SIGKILL" in report
    assert missing in " ".join(report.split()), report
    assert "the telemetry process died (killed by SIGKILL)" in result.stderr


def test_an_emitter_stopped_across_the_exit_is_named_then_its_late_copy_is_read(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run(tmp_path, "--steps", "800", "--at", "200", "--action", "stop", "--stop-s", "0",
                  TRACEML_EMITTER_STALL_S="2", TRACEML_SHUTDOWN_TIMEOUT_S="1")
    stopped = re.search(r"emitter (\d+) stop at step 200", result.stdout)
    assert stopped, result.stdout
    try:
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started < 60  # the trainer gave the stopped emitter up
        assert re.search(r"rank 0: telemetry process stopped responding .* at step ~\d+; [\d,]+ of 800 "
                         r"traced steps not written", result.stdout), result.stdout
        run_dir = _only_run_dir(tmp_path)
        assert "stopped responding" in _analyze(run_dir)  # a later analysis, still stopped: named too
    finally:
        os.kill(int(stopped[1]), signal.SIGCONT)  # it resumes and finishes its copy on its own
    deadline = time.monotonic() + 60
    while not read_export_stats(run_dir).stats[0].final and time.monotonic() < deadline:
        time.sleep(0.5)
    (stats,) = read_export_stats(run_dir).stats
    assert stats.final and stats.steps_local == 800 and stats.emitter_lost is None
    report = _analyze(run_dir)
    assert "800 aligned steps" in report and "finished later on its own" in " ".join(report.split())
