"""The Hugging Face Trainer callback on 1 and 2 processes (CPU, gloo), accumulation 4, a tiny BERT."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.harness import assert_steps, run_example

pytest.importorskip("transformers")

UPDATES, ACCUM = 6, 4


@pytest.mark.parametrize("nproc", [1, 2], ids=["1proc", "2proc-ddp"])
def test_trainer_callback(tmp_path: Path, nproc: int) -> None:
    run = run_example(
        tmp_path, "hf_trainer.py", nproc, "--steps", str(UPDATES), "--grad-accum", str(ACCUM),
        "--eval-steps", "2", "--save-steps", "3", "--output-dir", str(tmp_path / "out"))
    # Under torchrun (traceml run) the Trainer's Accelerate state is MULTI_CPU even for one process,
    # so the model is DDP-wrapped; the callback traces the unwrapped trainer.model and still says ddp.
    # One step span per optimizer update, its 4 micro-batches folded in:
    assert_steps(run, parallelism="ddp", updates=UPDATES, steps_per_update=1, calls_per_step=ACCUM)
    for rank_run in run.ranks.values():
        kinds = sorted({kind for kind, _, _ in rank_run.windows})
        assert kinds == ["checkpoint", "evaluation"]  # both ran, and no step span overlaps them
        # the Trainer fetches an update's micro-batches before it starts; evaluation batches are not
        # counted: every step's input wait is its own 4 fetches (+1 prefetched by Accelerate's loader)
        fetches = [s.attributes["traceml.input_wait.fetches"] for s in rank_run.steps]
        assert all(ACCUM <= f <= ACCUM + 1 for f in fetches), fetches
        assert all(s.attributes["traceml.optimizer.steps"] == 1 for s in rank_run.steps)
        # the update's samples: 4 micro-batches of the example's default batch of 8
        assert all(s.attributes["traceml.step.samples"] == ACCUM * 8 for s in rank_run.steps)
    assert run.report["run"]["parallelism"] == "ddp"
