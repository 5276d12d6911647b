"""A straggler made of a few slow steps of one rank (a checkpoint saved inside the step every 100
steps on rank 0, the others waiting at the next all-reduce) is said to be that, with the steps, in
both engines; a rank slow at every step is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.report.text import render_text

SPIKES = (99, 199, 299)


def _run(slow_every_step: bool) -> list[SyntheticStep]:
    """Two DDP ranks, 384 steps of ~15 ms; rank 0 takes 0.3 s more in the SPIKES steps (or 6 ms more in
    every step), and rank 1 waits for it in backward's gradient all-reduce."""
    steps = []
    for rank in range(2):
        for n in range(384):
            extra = 0.006 if slow_every_step else (0.3 if n in SPIKES else 0.0)
            steps.append(SyntheticStep(
                rank=rank, step=n, world_size=2, parallelism="ddp",
                forward=0.004 + (extra if rank == 0 else 0.0),
                backward=0.008 + (extra if rank == 1 else 0.0),
                ddp_wait=0.0005 + (extra if rank == 1 else 0.0)))
    return steps


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_a_straggler_made_of_a_few_steps_says_so_with_the_steps(tmp_path: Path, engine: str) -> None:
    analysis = analyze_path([write_run(tmp_path / "run", "run-spikes", _run(False))], engine=engine)
    straggler = next(f for f in (analysis.step.primary, *analysis.step.issues) if "STRAGGLER" in str(f.kind))
    evidence = {e.name: e.value for e in straggler.evidence}
    assert evidence["culprit_rank"] == 0 and evidence["recurrence"] == "none", evidence
    assert evidence["spike_steps"] == str(list(SPIKES))
    assert "so the gap is in a few steps, not in every step" in straggler.why
    assert "rank 0's slowest steps are 99 (" in straggler.why and "100 steps apart" in straggler.why
    assert "out of the step (traceml.outside_step)" in straggler.next
    assert "not in every step" in render_text(analysis).replace("\n           ", " ")


def test_a_rank_slow_at_every_step_is_chronic_not_a_few_steps(tmp_path: Path) -> None:
    analysis = analyze_path([write_run(tmp_path / "run", "run-chronic", _run(True))], engine="python")
    straggler = next(f for f in (analysis.step.primary, *analysis.step.issues) if "STRAGGLER" in str(f.kind))
    evidence = {e.name: e.value for e in straggler.evidence}
    assert evidence["recurrence"] == "chronic" and "spike_steps" not in evidence, evidence
    assert "not in every step" not in straggler.why
