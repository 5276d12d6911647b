"""Input wait inside a step is input wait: Lightning accumulation with slow fetches reads INPUT_BOUND
with one step per update, and DDP no_sync accumulation whose fetches are inside the explicit block
has its input wait measured (not "n/a")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.tools import import_or_missing
from tests.verdicts.runner import traceml_run


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_lightning_accumulation_with_slow_fetches_is_input_bound(tmp_path: Path, mode: str) -> None:
    import_or_missing("lightning")
    run = traceml_run(tmp_path, "lightning_accumulate.py", "--updates", "30",
                      *(("--callback",) if mode == "explicit" else ()))
    steps = [s for s in read_run(run.run_dir) if s.name == "traceml.step"]
    assert len(steps) == 30, len(steps)  # one step per update
    assert all(s.attributes["traceml.optimizer.steps"] == 1 for s in steps)
    inside = [s.attributes.get("traceml.input_wait.in_step.cpu_duration") for s in steps]
    assert sum(1 for v in inside if v) >= 25, inside  # the second batch, fetched inside the step
    primary = run.report["primary_diagnosis"]
    assert primary["kind"] == "INPUT_BOUND", primary
    residual = run.share("residual")
    assert residual is not None and residual < 0.20, residual
    # the time account agrees: the fetches inside the steps are input wait there too, not step time
    categories = {c["name"]: c["seconds"] for c in run.report["time_accounting"]["categories"]}
    in_steps = sum(v for k, v in categories.items() if k.startswith("step.") and k != "step.input_wait")
    assert categories["step.input_wait"] > in_steps, categories


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_ddp_no_sync_accumulation_measures_input_wait_inside_the_block(tmp_path: Path, mode: str) -> None:
    run = traceml_run(tmp_path, "ddp_no_sync.py", "--updates", "24",
                      *(("--zero-code",) if mode == "zero-code" else ()), launcher=("--nproc-per-node", "2"))
    steps = [s for s in read_run(run.run_dir) if s.name == "traceml.step"]
    assert len(steps) == 2 * 24, len(steps)  # one step per update on each rank
    assert all(s.attributes["traceml.optimizer.steps"] == 1 for s in steps)
    inside = [s.attributes.get("traceml.input_wait.in_step.cpu_duration") or 0.0 for s in steps]
    assert sum(1 for v in inside if v > 0) >= 40, inside  # 3 (zero-code) or 4 fetches inside each
    for rank in run.report["ranks"]:
        assert rank["input_wait_s"] is not None and rank["input_wait_s"] > 0.0, rank
    input_wait = run.share("input_wait")
    assert input_wait is not None and input_wait > 0.10, input_wait  # 4 slow fetches per update
    assert "n/a" not in run.stdout.split("Verdict")[-1].split("\n\n")[0]
