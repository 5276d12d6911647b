"""The Hugging Face Trainer callback on 1 and 2 processes (CPU, gloo), accumulation 4, a tiny BERT.

Two processes run three ways: DDP launched by ``torchrun`` directly (the user's own launcher, local
copy from ``TRACEML_RUNS_DIR``, report from ``traceml analyze``), and two independent trainings
(``use_cpu`` left off on a CPU machine) under ``traceml run``, one of them slower.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.frameworks.harness import FrameworkRun, assert_steps, run_example
from tests.tools import import_or_missing

import_or_missing("transformers")

UPDATES, ACCUM = 6, 4


def _train(tmp_path: Path, nproc: int, *extra: str, **launch) -> FrameworkRun:
    return run_example(
        tmp_path, "hf_trainer.py", nproc, "--steps", str(UPDATES), "--grad-accum", str(ACCUM),
        "--eval-steps", "2", "--save-steps", "3", "--output-dir", str(tmp_path / "out"), *extra, **launch)


def _assert_trainer_steps(run: FrameworkRun, parallelism: str) -> None:
    # One step span per optimizer update, its 4 micro-batches folded in:
    assert_steps(run, parallelism=parallelism, updates=UPDATES, steps_per_update=1, calls_per_step=ACCUM)
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
    assert run.report["run"]["parallelism"] == parallelism


def test_trainer_callback_one_process(tmp_path: Path) -> None:
    # One process under traceml run gets python's environment (no torchrun variables): the Trainer
    # does not DDP-wrap the model, as under `python train.py`.
    _assert_trainer_steps(_train(tmp_path, 1), "none")


def test_trainer_callback_under_torchrun_ddp(tmp_path: Path) -> None:
    # rank 0 traces the unwrapped model (what the callback passes), rank 1 the DDP wrapper: both ddp
    run = _train(tmp_path, 2, torchrun=True, env={"TRACE_WRAPPED_RANK": "1"})
    _assert_trainer_steps(run, "ddp")
    assert run.report["run"]["world_size"] == 2


def test_trainer_callback_independent_processes(tmp_path: Path) -> None:
    # use_cpu off on a CPU machine: two processes, each training alone; rank 1 is slower
    run = _train(tmp_path, 2, "--no-use-cpu", env={"SLOW_RANK": "1", "SLOW_OPTIMIZER_MS": "80"})
    _assert_trainer_steps(run, "independent")
    issues = run.report["issues"]
    assert not any(f["kind"].endswith("STRAGGLER") for f in issues), issues
    assert "collective" not in json.dumps(issues)
    (compared,) = [f for f in issues if f["kind"] == "INDEPENDENT_RANKS"]
    evidence = {e["name"]: e["value"] for e in compared["evidence"]}
    assert evidence["slowest_rank"] == 1
