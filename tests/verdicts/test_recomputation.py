"""Recomputation is backward: gradient checkpointing (reentrant or not) re-runs each block's forward
inside backward; that is one forward per step, and no share is above 100 %."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.verdicts.runner import traceml_run


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_checkpointed_blocks_count_one_forward(tmp_path: Path, mode: str, reentrant: bool) -> None:
    args = ["--steps", "40", *(["--explicit"] if mode == "explicit" else []),
            *(["--reentrant"] if reentrant else [])]
    run = traceml_run(tmp_path, "checkpointed.py", *args)
    spans = read_run(run.run_dir)
    steps = {s.span_id for s in spans if s.name == "traceml.step"}
    per_step = Counter(s.parent_span_id for s in spans if s.name == "traceml.forward")
    counts = Counter(per_step.get(step, 0) for step in steps)
    assert set(counts) == {1}, counts  # the model's call, never a block's recomputation
    # one model ran: its forward spans are not named per model (traceml.module.class)
    assert not any("traceml.module.class" in s.attributes for s in spans if s.name == "traceml.forward")
    names = ("input_wait", "forward", "backward", "optimizer", "residual")
    shares = {name: run.share(name) for name in names}
    assert all(v is not None for v in shares.values()), shares
    assert sum(shares.values()) <= 1.0 + 1e-6, shares  # type: ignore[arg-type]
    compute = run.share("compute")
    assert compute is not None and compute <= 1.0, compute
    # the backward (with its recomputation) outweighs the forward
    assert shares["backward"] > shares["forward"], shares  # type: ignore[operator]
    assert "119 %" not in run.stdout and "Forward, backward and optimizer take 1" not in run.report[
        "primary_diagnosis"]["why"]
