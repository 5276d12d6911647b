"""Only the training loader's fetches are training input wait: an unmarked slow validation pass
between steps (model.eval(), no_grad, its own slow DataLoader) is time between steps, not the next
step's input wait, in both modes; so is one that forgot eval() and no_grad, told from training by
its loader alone (capture/training_loader.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.verdicts.runner import traceml_run


@pytest.mark.parametrize("careless", [False, True], ids=["eval-no-grad", "grad-on"])
@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_unmarked_validation_is_not_input_wait(tmp_path: Path, mode: str, careless: bool) -> None:
    run = traceml_run(tmp_path, "unmarked_validation.py", "--steps", "100",
                      *(("--explicit",) if mode == "explicit" else ()),
                      *(("--careless",) if careless else ()))
    primary = run.report["primary_diagnosis"]
    assert primary["kind"] != "INPUT_BOUND", primary
    assert not any(f["kind"] == "INPUT_BOUND" for f in run.report["issues"]), run.report["issues"]
    input_wait = run.share("input_wait")
    assert input_wait is not None and input_wait < 0.10, input_wait
    # 5 validation passes of 32 samples at 4 ms each: about 0.64 s, counted between steps
    account = run.report["time_accounting"]
    assert account is not None
    categories = dict((c["name"], c["seconds"]) for c in account["categories"])
    assert categories.get("between_steps", 0.0) >= 0.4, categories
    # one step per training batch: the validation forwards opened no step, none was merged into one
    steps = [s for s in read_run(run.run_dir) if s.name == "traceml.step"]
    assert len(steps) == 100, len(steps)
    assert all(s.attributes.get("traceml.input_wait.fetches", 0) <= 1 for s in steps), [
        s.attributes.get("traceml.input_wait.fetches") for s in steps]
    # the training loader's settings, never the validation loader's (SlowValidation)
    datasets = {s.attributes.get("traceml.dataloader.dataset") for s in steps} - {None}
    assert datasets == {"TensorDataset"}, datasets
