"""A rank that dies inside a deep capture (SIGSEGV, as a crash in torch's profiler ends it), restarted
by torchrun under ``traceml run --max-restarts 1``: the crash is named as possibly ours in the report,
and the restarted attempt neither takes the earlier attempt's request again nor any automatic capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from traceml_otel.analyze.kinds import RunKind
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.report.captures_section import captures_json
from traceml_otel.wire.capture_in_flight import CaptureInFlight, read_in_flight, write_in_flight
from traceml_otel.wire.capture_record import read_status, status_file_name

SCRIPT = Path(__file__).resolve().parent / "scripts" / "crash_mid_capture.py"


def test_a_rank_that_crashes_mid_capture_is_named_and_its_restart_takes_no_capture(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", "--run-id", "crash",
         "--max-restarts", "1", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    run_dir = tmp_path / "runs" / "crash"
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "exitcode: -11" in out and "automatic captures are off for this attempt" in out, out[-3000:]
    # The restarted attempt trained to the end with no profiler on: the first attempt's on-demand
    # request was not taken again, and an automatic one was refused.
    assert json.loads((run_dir / "attempt-1.json").read_text()) == {"attempt": 1, "profiled": False}
    status = read_status(run_dir / status_file_name(0))
    assert status is not None and status.started == 0 and status.refused.get("automatic captures off"), status
    (marker,) = read_in_flight(run_dir)
    assert (marker.rank, marker.request, marker.restart, marker.with_stack) == (0, "crash-test", 0, True)
    analysis = analyze_path([run_dir])
    (failed,) = [f for f in analysis.run_findings if f.kind == RunKind.RUN_FAILED]
    assert "SIGSEGV" in failed.title
    assert "torch.profiler with Python stacks on may have crashed it" in failed.why
    assert ("capture_in_flight", 0) in [(e.name, e.value) for e in failed.evidence]
    assert captures_json(analysis)["capture_in_flight"][0]["request"] == "crash-test"


def test_markers_are_one_per_attempt_and_read_bounded(tmp_path: Path) -> None:
    for restart in (0, 1):
        write_in_flight(tmp_path, CaptureInFlight(rank=3, request=f"r{restart}", reason="spike",
                                                  with_stack=False, armed_unix=1.0, restart=restart,
                                                  at_step=40, running=True))
    (tmp_path / "rank-4.capture-running.0.json").write_text("{" * 10_000)  # hostile: left out
    markers = read_in_flight(tmp_path)
    assert [(m.rank, m.restart, m.request, m.at_step, m.running) for m in markers] == [
        (3, 0, "r0", 40, True), (3, 1, "r1", 40, True)]
    assert len(read_in_flight(tmp_path, limit=1)) == 1
