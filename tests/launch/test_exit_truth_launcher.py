"""A top-level ``raise SystemExit(n)`` (n != 0) is a failure on every ``traceml run`` path.

The process cannot see its own exit code before its scrape endpoint closes (Python hands the code to
the C runtime after every ``atexit`` hook), so the rank itself says ``clean``; the launcher sees the
exit status of its children and records it: ``manifest.json`` (``first_failure_rank``,
``first_failure``), ``traceml analyze`` (RUN FAILED) and, once the ranks exited, the first rank port
serving ``traceml_run_first_failure`` for the ranks' linger (TraceMLJobFailed fires from it). Real
processes: one process and two torchrun ranks, with ``traceml.init()`` and zero-code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.first_failure_job import FIRST_FAILURE, REPO, failing_job_env, run_watching_first_failure
from tests.ports import free_port_pair
from traceml_otel.wire.manifest import read_manifest

SCRIPT = REPO / "tests" / "launch" / "scripts" / "raise_exit.py"


@pytest.mark.parametrize(("nproc", "mode"), [(1, "explicit"), (1, "zero-code"), (2, "explicit")])
def test_raise_system_exit_is_a_failure(tmp_path: Path, nproc: int, mode: str) -> None:
    port = free_port_pair()
    env = failing_job_env(tmp_path, port, linger_s=6)
    job = run_watching_first_failure(["--run-id", "sx", "--nproc-per-node", str(nproc), str(SCRIPT), "3",
                                      mode], env, tmp_path, port, poll_s=0.3)
    out, seen = job.output, job.page
    assert job.returncode == 3, out[-3000:]
    run_dir = tmp_path / "runs" / "sx"
    manifest = read_manifest(run_dir).manifest
    assert manifest is not None
    first = manifest.first_failure_rank  # of two ranks, the one that exited first
    assert first in range(nproc) and (manifest.exit_code, manifest.first_failure) == (3, "exit code 3")
    assert f"rank {first} failed first (exit code 3)" in out, out[-3000:]
    (line,) = [x for x in seen.splitlines() if x.startswith(FIRST_FAILURE)]
    for label in ('traceml_run_id="sx"', 'traceml_rank="0"', f'traceml_first_failure_rank="{first}"',
                  'traceml_first_failure_reason="exit code 3"'):  # served on the first rank's port
        assert label in line, line
    analysis = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir)],
                              env=env, capture_output=True, text=True, timeout=240)
    assert "RUN FAILED" in analysis.stdout and "exit code 3" in analysis.stdout, analysis.stdout
