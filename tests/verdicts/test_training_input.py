"""Only the training loader's fetches are training input wait: an unmarked slow validation pass
between steps (model.eval(), no_grad, its own slow DataLoader) is time between steps, not the next
step's input wait, in both modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verdicts.runner import traceml_run


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_unmarked_validation_is_not_input_wait(tmp_path: Path, mode: str) -> None:
    run = traceml_run(tmp_path, "unmarked_validation.py", "--steps", "100",
                      *(("--explicit",) if mode == "explicit" else ()))
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
