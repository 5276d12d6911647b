"""Real ``traceml run``s compared with several runs per side: the CPU samples are written and used.

Four runs of the same script (two per side) run side by side on a loaded machine; no timing is
asserted, only what the comparison must say and that the gate does not fail on identical code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_otel.wire.cpu_record import read_cpu_record

SCRIPT = Path(__file__).resolve().parent / "scripts" / "same_samples.py"
STEPS = 8192
"""About 1 s of ~0.1 ms steps on an idle core: enough 0.1 s CPU samples over the steady steps for an
interval whatever the machine's load (384 steps gave 2 samples on an idle machine: no CPU interval)."""


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(folder / "runs"), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("compare-real")
    running = []
    for run_id in ("a1", "a2", "b1", "b2"):
        with open(folder / f"{run_id}.out", "w") as out:
            running.append(subprocess.Popen(
                [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", run_id, "--no-report",
                 str(SCRIPT), "--batch-size", "16", "--samples", str(16 * STEPS)],
                env=_env(folder), cwd=folder, stdout=out, stderr=subprocess.STDOUT))
    for process in running:
        assert process.wait(timeout=400) == 0
    return folder


def test_each_run_records_the_training_threads_cpu_samples(runs: Path) -> None:
    record = read_cpu_record(runs / "runs" / "a1" / "rank-0.cpu.json")
    assert record.rank == 0 and record.run_id == "a1" and record.source in ("schedstat", "stat")
    assert len(record.samples) >= 3
    # The emitter keeps no sample after the last step's end (one taken at shutdown read the trainer's
    # teardown as the last steps' CPU: a false REGRESSION in benchmarks/compare_aa.py's A/A pairs); the
    # last one comes from the run's second half (the samples are 0.1 s apart, the run ~1 s or longer).
    assert STEPS // 2 < record.samples[-1][0] <= STEPS
    steps, clock, on_cpu = zip(*[(s[0], s[1], s[2]) for s in record.samples], strict=True)
    assert list(steps) == sorted(steps) and list(clock) == sorted(clock) and list(on_cpu) == sorted(on_cpu)


def test_two_runs_per_side_of_the_same_code_pass_the_gate(runs: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "compare", str(runs / "runs" / "a*"), "--against",
         str(runs / "runs" / "b1"), str(runs / "runs" / "b2"), "--json", "--fail-on-regression"],
        env=_env(runs), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    def refuse(token: str) -> None:
        raise ValueError(token)

    document = json.loads(done.stdout, parse_constant=refuse)
    assert document["verdict"] in ("EQUIVALENT", "INCONCLUSIVE", "IMPROVEMENT")
    assert document["interval"]["between_runs"] is True and document["basis"] == "sample"
    assert document["cpu_interval"] is not None  # both sides recorded CPU samples
    assert document["a"]["cpu_wait_share"] is not None
    page = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "compare", str(runs / "runs" / "a1"),
         str(runs / "runs" / "b1"), "--html", "-o", str(runs / "cmp.html")],
        env=_env(runs), capture_output=True, text=True, timeout=300)
    assert page.returncode == 0, page.stderr
    html = (runs / "cmp.html").read_text()
    assert "on-CPU time" in html and "only within-run noise was available" in html
