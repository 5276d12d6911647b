"""A rank killed by the OS is named as the first failure from the launcher's view of its children:
a real 2-rank gloo job under ``traceml run`` whose rank 1 is SIGKILLed mid-run. The manifest (the
run-end record), the survivor's scrape endpoint (``traceml_run_first_failure``) and the diagnosis
name rank 1; the survivor's own error or SIGTERM is a consequence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.launch.first_failure_job import FIRST_FAILURE, REPO, failing_job_env, run_watching_first_failure
from tests.ports import free_port_pair
from traceml_otel.launch.child_watch import FirstFailure, describe_exit, first_failure_of
from traceml_otel.wire.manifest import read_manifest

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


def test_a_sigkilled_rank_is_the_first_failure_everywhere(tmp_path: Path) -> None:
    port = free_port_pair()
    env = failing_job_env(tmp_path, port, linger_s=15)
    job = run_watching_first_failure(["--run-id", "killed", "--nproc-per-node", "2", str(SCRIPT), "1", "30",
                                      "100000"], env, tmp_path, port, poll_s=0.5)  # rank 0's endpoint lingers
    out, seen = job.output, job.page
    assert job.returncode == 128 + 9, out[-3000:]
    (line,) = [x for x in seen.splitlines() if x.startswith(FIRST_FAILURE)]
    assert 'traceml_first_failure_rank="1"' in line and 'traceml_first_failure_reason="SIGKILL"' in line, line
    assert 'traceml_rank="0"' in line, line  # exported by the survivor's endpoint
    manifest = read_manifest(tmp_path / "runs" / "killed").manifest
    assert manifest is not None
    assert (manifest.first_failure_rank, manifest.first_failure) == (1, "SIGKILL"), manifest
    analysis = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "analyze", str(tmp_path / "runs" / "killed")],
        env=env, capture_output=True, text=True, timeout=240)
    assert "rank 1 was killed (SIGKILL)" in analysis.stdout, analysis.stdout + analysis.stderr
