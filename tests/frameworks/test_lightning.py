"""The Lightning callback on 1 process (pytorch_lightning) and 2 (lightning.pytorch, DDP over gloo)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.frameworks.harness import assert_steps, run_example

BATCHES, ACCUM = 24, 4


@pytest.mark.parametrize(
    ("nproc", "package", "parallelism"),
    [(1, "pytorch_lightning", "none"), (2, "lightning.pytorch", "ddp")],
    ids=["1proc-pytorch_lightning", "2proc-ddp-lightning"],
)
def test_lightning_callback(tmp_path: Path, nproc: int, package: str, parallelism: str) -> None:
    if importlib.util.find_spec(package.split(".")[0]) is None:
        pytest.skip(f"{package} is not installed")
    run = run_example(tmp_path, "lightning_train.py", nproc, "--steps", str(BATCHES),
                      "--grad-accum", str(ACCUM), "--val-every", "8", "--package", package)
    # one step span per training batch; the batches that only accumulate are micro-steps
    assert_steps(run, parallelism=parallelism, updates=BATCHES // ACCUM, steps_per_update=ACCUM,
                 calls_per_step=1)
    for rank_run in run.ranks.values():
        assert len(rank_run.windows) == BATCHES // 8  # validation ran, between steps
        flags = [s.attributes["traceml.optimizer.steps"] for s in rank_run.steps]
        assert flags == [0, 0, 0, 1] * (BATCHES // ACCUM)
        fetches = [s.attributes["traceml.input_wait.fetches"] for s in rank_run.steps]
        assert all(1 <= f <= 2 for f in fetches), fetches  # validation batches are not input wait
    assert run.report["run"]["parallelism"] == parallelism
