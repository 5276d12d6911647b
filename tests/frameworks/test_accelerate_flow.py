"""The Accelerate flow with accumulation 4, on 1 and 2 processes (CPU, gloo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.harness import assert_steps, run_example
from tests.tools import import_or_missing

import_or_missing("accelerate")

MICRO, ACCUM = 24, 4  # micro-batches per process, accumulation


@pytest.mark.parametrize(
    ("nproc", "env", "parallelism"),
    [
        (1, {}, "none"),
        (2, {"ACCELERATE_USE_CPU": "1"}, "ddp"),  # DDP, while trace_step gets accelerator.unwrap_model(model)
        (2, {}, "independent"),  # a CPU machine without ACCELERATE_USE_CPU: two separate trainings
    ],
    ids=["1proc", "2proc-ddp", "2proc-independent"],
)
def test_accelerate_flow(tmp_path: Path, nproc: int, env: dict, parallelism: str) -> None:
    run = run_example(tmp_path, "accelerate_minimal.py", nproc, "--steps", str(MICRO),
                      "--grad-accum", str(ACCUM), "--eval-every", "2", env=env)
    updates = MICRO // ACCUM
    assert_steps(run, parallelism=parallelism, updates=updates, steps_per_update=ACCUM, calls_per_step=1)
    for rank_run in run.ranks.values():
        assert len(rank_run.windows) == MICRO // ACCUM // 2  # evaluation ran, between steps
        flags = [s.attributes["traceml.optimizer.steps"] for s in rank_run.steps]
        assert flags == [0, 0, 0, 1] * (MICRO // ACCUM)  # micro-steps marked as the contract says
        # the example evaluates inside traceml.outside_step: those fetches are no step's input wait
        fetches = [s.attributes["traceml.input_wait.fetches"] for s in rank_run.steps]
        assert all(1 <= f <= 2 for f in fetches), fetches
    assert run.report["run"]["parallelism"] == parallelism
    kinds = [finding["kind"] for finding in run.report["issues"]]
    if parallelism == "independent":
        assert not any(kind.endswith("STRAGGLER") for kind in kinds), kinds
