"""A script that handles SIGTERM itself keeps its grace period (issue 38): a real ``traceml run``
whose OTLP endpoint accepts connections and never answers, SIGTERM sent to the launcher after step 49.

The script's handler (installed before ``traceml.init()``) must run within 1 s of the signal, not
after a telemetry flush; the 50 steps it runs after the signal are in the local copy, and the
account counts every traced step (no "complete" over a short copy).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.launch.test_faults import _blackhole

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "preemptible.py"


def _rows(table: Path) -> list[str]:
    return table.read_text().splitlines()[1:]


def test_the_scripts_handler_runs_at_once_and_the_steps_after_it_are_written(tmp_path: Path) -> None:
    server, endpoint = _blackhole()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               TRACEML_RUNS_DIR=str(tmp_path / "runs"), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
               OTEL_EXPORTER_OTLP_TIMEOUT="30", TRACEML_SHUTDOWN_TIMEOUT_S="4",
               PREEMPT_OUT=str(tmp_path / "saved.json"))
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "pre", str(SCRIPT)],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            seen.append(line)
            if line.startswith("step 49") or not line:
                break
        assert seen[-1].startswith("step 49"), "".join(seen)[-3000:]
        sent = time.time()
        process.send_signal(signal.SIGTERM)  # the scheduler's: to the launcher, forwarded to the rank
        output, _ = process.communicate(timeout=120)
    finally:
        server.close()
    saved = json.loads((tmp_path / "saved.json").read_text())
    late = saved["handled_at"] - sent
    assert late < 1.0, f"the script's handler ran {late:.1f} s after SIGTERM"
    assert saved["steps_after"] == 50
    run_dir = tmp_path / "runs" / "pre"
    rows = _rows(run_dir / "rank-0.steps.csv")
    assert len(rows) == 100, output[-3000:]
    stats = json.loads((run_dir / "rank-0.export.json").read_text())
    assert stats["steps_traced"] == 100 and stats["steps_local"] == 100, stats
    account = [line for line in output.splitlines() if line.strip().startswith("local copy:")]
    assert account and "100 of 100" in account[0], output[-3000:]


_LOOP = """
import os, signal, sys, torch
import traceml_otel as traceml
MODE = sys.argv[1]
if MODE == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
traceml.init()
handled = []
if MODE == "chained":  # a framework's handler, installed after init(), calling the one it found
    found = signal.getsignal(signal.SIGTERM)
    def chained(signum, frame):
        handled.append(signum)
        if callable(found):
            found(signum, frame)
    signal.signal(signal.SIGTERM, chained)
model = torch.nn.Linear(4, 1)
for step in range(40):
    with traceml.trace_step(model):
        model(torch.randn(2, 4)).sum().backward()
    if step == 19:
        os.kill(os.getpid(), signal.SIGTERM)
print("trained on", handled, flush=True)
"""


def test_an_ignored_or_chained_sigterm_does_not_end_telemetry(tmp_path: Path) -> None:
    for mode in ("ignored", "chained"):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TRACEML_RUNS_DIR=str(tmp_path / "runs"),
                   TRACEML_RUN_ID=mode)
        done = subprocess.run([sys.executable, "-c", _LOOP, mode], env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0 and "trained on" in done.stdout, done.stderr[-2000:]
        assert len(_rows(tmp_path / "runs" / mode / "rank-0.steps.csv")) == 40, (mode, done.stderr[-2000:])
