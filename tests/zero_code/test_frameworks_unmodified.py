"""Unmodified Hugging Face Trainer and Lightning scripts (no traceml import) under ``traceml run``.

The launcher's start-up hook attaches the callbacks at import: one step span per optimizer update,
with phases; evaluation and checkpoints outside every step; a script that also adds the callback by
hand is traced once. One and two processes each (two: DDP over gloo, with the hand-added callback).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.harness import FrameworkRun, assert_steps, run_example
from tests.tools import import_or_missing

SCRIPTS = Path(__file__).resolve().parent / "scripts"
UPDATES = 4


def _check(run: FrameworkRun, *, source: str, parallelism: str, calls: int, windows: set[str]) -> None:
    assert_steps(run, parallelism=parallelism, updates=UPDATES, steps_per_update=1, calls_per_step=calls)
    for rank_run in run.ranks.values():
        assert {s.attributes["traceml.step.source"] for s in rank_run.steps} == {source}
        assert {kind for kind, _, _ in rank_run.windows} == windows  # they ran; no step overlaps them
    assert "nested" not in run.output  # a second callback would open nested (uncounted) steps
    assert "zero-code tracing could not" not in run.output


@pytest.mark.parametrize(("nproc", "extra", "parallelism"), [
    (1, ("--subclass",), "none"),  # one process: python's environment, no DDP wrapper (issue 38)
    (2, ("--callback",), "ddp"),
], ids=["1proc-subclass", "2proc-with-callback"])
def test_unmodified_trainer(tmp_path: Path, nproc: int, extra: tuple, parallelism: str) -> None:
    import_or_missing("transformers")
    run = run_example(tmp_path, str(SCRIPTS / "plain_trainer.py"), nproc, str(tmp_path / "out"), *extra)
    _check(run, source="hf_trainer", parallelism=parallelism, calls=2, windows={"evaluation", "checkpoint"})


@pytest.mark.parametrize(("nproc", "package", "extra", "parallelism"), [
    (1, "pytorch_lightning", ("--pl",), "none"),
    (2, "lightning", ("--callback",), "ddp"),
], ids=["1proc-pytorch_lightning", "2proc-lightning-with-callback"])
def test_unmodified_lightning(
    tmp_path: Path, nproc: int, package: str, extra: tuple, parallelism: str
) -> None:
    import_or_missing(package)
    run = run_example(tmp_path, str(SCRIPTS / "plain_lightning.py"), nproc, str(tmp_path / "out"), *extra)
    _check(run, source="lightning", parallelism=parallelism, calls=1, windows={"evaluation", "checkpoint"})
