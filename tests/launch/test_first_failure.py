"""A rank killed by the OS is named as the first failure from the launcher's view of its children:
a real 2-rank gloo job under ``traceml run`` whose rank 1 is SIGKILLed mid-run. The manifest (the
run-end record), the survivor's scrape endpoint (``traceml_run_first_failure``) and the diagnosis
name rank 1; the survivor's own error or SIGTERM is a consequence."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port_pair
from traceml_otel.launch.child_watch import FirstFailure, describe_exit, first_failure_of
from traceml_otel.wire.manifest import read_manifest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "killed_rank.py"


class _Failure:
    def __init__(self, exitcode: int, timestamp: int) -> None:
        self.exitcode, self.timestamp = exitcode, timestamp


def test_first_failure_prefers_the_earliest_then_a_killed_rank_and_ignores_stops() -> None:
    assert describe_exit(-9) == "SIGKILL" and describe_exit(3) == "exit code 3"
    same_second = {0: _Failure(1, 100), 1: _Failure(-9, 100)}  # rank 0's gloo error, rank 1 killed
    assert first_failure_of(same_second) == FirstFailure(1, "SIGKILL", 137)
    assert first_failure_of({0: _Failure(1, 99), 1: _Failure(-9, 100)}) == FirstFailure(0, "exit code 1", 1)
    assert first_failure_of({0: _Failure(-15, 100), 1: _Failure(-2, 100)}) is None  # stopped, not failed
    assert first_failure_of({1: _Failure(3, 5)}, rank_offset=8) == FirstFailure(9, "exit code 3", 3)


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return reply.read().decode()
    except OSError:
        return ""


def test_a_sigkilled_rank_is_the_first_failure_everywhere(tmp_path: Path) -> None:
    port = free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="15",
               TRACEML_FLUSH_INTERVAL_MS="100")
    job = subprocess.Popen([sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "killed",
                            "--nproc-per-node", "2", str(SCRIPT), "1", "30", "100000"],
                           env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            page = _scrape(port)  # rank 0's endpoint, lingering after its end
            if "traceml_run_first_failure{" in page:
                seen = page
                break
            time.sleep(0.5)
        out, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate(timeout=60)
    assert job.returncode == 128 + 9, out[-3000:]
    (line,) = [x for x in seen.splitlines() if x.startswith("traceml_run_first_failure{")]
    assert 'traceml_first_failure_rank="1"' in line and 'traceml_first_failure_reason="SIGKILL"' in line, line
    assert 'traceml_rank="0"' in line, line  # exported by the survivor's endpoint
    manifest = read_manifest(tmp_path / "runs" / "killed").manifest
    assert manifest is not None
    assert (manifest.first_failure_rank, manifest.first_failure) == (1, "SIGKILL"), manifest
    analysis = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "analyze", str(tmp_path / "runs" / "killed")],
        env=env, capture_output=True, text=True, timeout=240)
    assert "rank 1 was killed (SIGKILL)" in analysis.stdout, analysis.stdout + analysis.stderr
