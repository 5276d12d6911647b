"""The Lightning callback on 1 process (pytorch_lightning) and 2 (lightning.pytorch): DDP over gloo,
and two independent trainings (one device per process, no DDP) with one of them slower."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.frameworks.harness import assert_steps, run_example
from tests.tools import import_or_missing

BATCHES, ACCUM = 24, 4


@pytest.mark.parametrize(
    ("nproc", "package", "parallelism", "extra", "env"),
    [
        (1, "pytorch_lightning", "none", (), {}),
        # rank 0 traces the LightningModule (what the callback passes), rank 1 the DDP wrapper: both ddp
        (2, "lightning.pytorch", "ddp", (), {"TRACE_WRAPPED_RANK": "1"}),
        (2, "lightning.pytorch", "independent", ("--independent",),
         {"SLOW_RANK": "1", "SLOW_OPTIMIZER_MS": "60"}),
    ],
    ids=["1proc-pytorch_lightning", "2proc-ddp-lightning", "2proc-independent-lightning"],
)
def test_lightning_callback(
    tmp_path: Path, nproc: int, package: str, parallelism: str, extra: tuple, env: dict
) -> None:
    import_or_missing(package.split(".")[0])
    run = run_example(tmp_path, "lightning_train.py", nproc, "--steps", str(BATCHES),
                      "--grad-accum", str(ACCUM), "--val-every", "8", "--save-every", "3",
                      "--checkpoint-dir", str(tmp_path / "out"), "--package", package, *extra, env=env)
    # one step span per optimizer update, holding its ACCUM micro-batches
    assert_steps(run, parallelism=parallelism, updates=BATCHES // ACCUM, steps_per_update=1,
                 calls_per_step=ACCUM)
    for rank_run in run.ranks.values():
        kinds = [kind for kind, _, _ in rank_run.windows]
        # validation and checkpoints ran, between steps (assert_steps: no step span overlaps them)
        assert kinds.count("evaluation") == BATCHES // 8 and kinds.count("checkpoint") >= 2, kinds
        flags = [s.attributes["traceml.optimizer.steps"] for s in rank_run.steps]
        assert flags == [1] * (BATCHES // ACCUM)
        fetches = [s.attributes["traceml.input_wait.fetches"] for s in rank_run.steps]
        # the update's first batch before the step, its other ACCUM - 1 inside it (input wait too);
        # validation batches are not input wait
        assert all(ACCUM <= f <= ACCUM + 1 for f in fetches), fetches
        samples = [s.attributes["traceml.step.samples"] for s in rank_run.steps]
        assert samples == [ACCUM * 32] * (BATCHES // ACCUM), samples  # every micro-batch of the update
    assert run.report["run"]["parallelism"] == parallelism
    if parallelism == "independent":
        issues = run.report["issues"]
        assert not any(f["kind"].endswith("STRAGGLER") for f in issues), issues
        assert "collective" not in json.dumps(issues)
        (compared,) = [f for f in issues if f["kind"] == "INDEPENDENT_RANKS"]
        assert {e["name"]: e["value"] for e in compared["evidence"]}["slowest_rank"] == 1
