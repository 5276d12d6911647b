"""Ctrl-C and SIGTERM end a run as interrupted, not failed: Ctrl-C at a terminal (SIGINT to the whole
foreground process group), and ``traceml run`` started in the background (SIGINT ignored, as a shell
does for ``cmd &`` in a script) then sent SIGINT or SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceml_otel.analyze.evidence import run_findings
from traceml_otel.analyze.findings import RankCount

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _terminal_group() -> None:
    """A foreground job of its own: a process group a terminal's Ctrl-C reaches as a whole (with the
    default SIGINT action, even when the suite itself runs in the background)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("launch", "signum"), [
    ("background", signal.SIGINT), ("background", signal.SIGTERM), ("terminal", signal.SIGINT),
])
def test_an_interrupted_launch_stops_and_reports_an_interrupt(
    tmp_path: Path, launch: str, signum: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "r", str(STEADY), "--",
         "--steps", "100000", "--sleep", "0.01"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # `traceml run ... &` from a script ignores SIGINT; at a terminal, Ctrl-C signals the whole group
        preexec_fn=_ignore_sigint if launch == "background" else _terminal_group,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "completed 20" not in process.stdout.readline():
        pass
    if launch == "terminal":
        os.killpg(process.pid, signum)  # launcher, ranks and emitters at once, as Ctrl-C does
    else:
        process.send_signal(signum)
    sent = time.monotonic()
    output, _ = process.communicate(timeout=90)
    took = time.monotonic() - sent
    assert took < 20, f"the script ran on {took:.0f} s after the signal (killed after 30 s?)"
    assert process.returncode == 128 + signum
    assert "RUN INTERRUPTED [warning]" in output and "RUN FAILED" not in output
    assert "killed?" not in output
    report = json.loads((tmp_path / "runs" / "r" / "report.json").read_text())
    (finding,) = [f for f in report["run_findings"] if f["kind"] == "RUN_INTERRUPTED"]
    how = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
    assert f"by {how}" in finding["title"]
    assert "interrupted at step" in finding["title"] or "interrupted after step" in finding["title"]


def test_missing_ranks_with_no_rank_seen_does_not_speak_of_other_ranks() -> None:
    (finding,) = run_findings(world_size=2, counts=(), failures=(), failed_steps=0, exit_code=None)
    assert "other ranks" not in finding.why and "no rank sent any" in finding.why
    seen = run_findings(world_size=2, counts=(RankCount(0, 10, 0, 9),), failures=(), failed_steps=0,
                        exit_code=None)
    assert "drawn from the other ranks only" in seen[0].why
