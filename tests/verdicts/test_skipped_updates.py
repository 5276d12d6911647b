"""Skipped updates: a GradScaler skipping every 5th update still ends its step (both modes), is
counted as a skipped update in the report, and is never called gradient accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.verdicts.runner import traceml_run


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_gradscaler_skipping_every_fifth_update(tmp_path: Path, mode: str) -> None:
    run = traceml_run(tmp_path, "scaler_skips.py", "--steps", "100",
                      *(("--explicit",) if mode == "explicit" else ()))
    steps = sorted((s for s in read_run(run.run_dir) if s.name == "traceml.step"),
                   key=lambda s: s.attributes["traceml.step.number"])
    assert len(steps) == 100  # a skipped update still ends its step
    skipped = [s.attributes.get("traceml.optimizer.skipped", 0) for s in steps]
    assert sum(skipped) == 20 and skipped[4::5] == [1] * 20, skipped
    assert [s.attributes["traceml.optimizer.steps"] for s in steps] == [0 if i % 5 == 4 else 1
                                                                          for i in range(100)]
    accumulation = run.report["accumulation"]
    startup = run.report["window"]["startup_steps"]  # a first step 10x the others leaves the window
    assert startup <= 4 and accumulation["optimizer_updates"] == 80 - startup, accumulation  # (no skip)
    assert accumulation["skipped_updates"] == 20, accumulation
    assert accumulation["micro_steps"] == 0, accumulation
    assert "20 skipped updates" in run.stdout
    assert "accumulation" not in run.stdout.lower(), run.stdout
