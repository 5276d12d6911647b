"""Zero-code tracing of a loop that updates its parameters by hand (no torch.optim optimizer).

Inferred steps end at an optimizer update; with no optimizer built, a step ends when its backward
returns, so each iteration is a step with its forward and backward, the hand-made update falls
between steps, and a DataLoader's fetch is the next step's input wait. Before, such a loop recorded
no step at all ("rank 0 sent no telemetry").
"""

from __future__ import annotations

from pathlib import Path

from tests.zero_code.runner import traceml_runs_together

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "manual_update_loop.py"


def test_each_backward_of_a_loop_without_optimizer_ends_a_step(tmp_path: Path) -> None:
    kinds = ("loader", "slices", "then_explicit", "then_optimizer")
    for kind in kinds:
        (tmp_path / kind).mkdir()
    *runs, explicit, optimized = traceml_runs_together(
        [(tmp_path / kind, SCRIPT, (kind,)) for kind in kinds[:2]]
        + [(tmp_path / kinds[2], SCRIPTS / "manual_then_trace_step.py", ()),
           (tmp_path / kinds[3], SCRIPTS / "manual_then_optimizer.py", ())])
    # Steps by hand, then an optimizer: its updates end the steps (two backwards each).
    assert "Traceback" not in optimized.output, optimized.output[-3000:]
    updates = [step.attributes["traceml.optimizer.steps"] for step in optimized.ranks[0].steps]
    assert updates == [0] * 3 + [1] * 5
    backwards = [[span.name for span in optimized.ranks[0].children.get(step.span_id, [])].count(
        "traceml.backward") for step in optimized.ranks[0].steps]
    assert backwards == [1] * 3 + [2] * 5
    # Steps by hand, then trace_step blocks: those end where the blocks end (the update inside them).
    assert "Traceback" not in explicit.output, explicit.output[-3000:]
    sources = [step.attributes["traceml.step.source"] for step in explicit.ranks[0].steps]
    assert sources == ["inferred"] * 3 + ["trace_step"] * 5
    assert all(step.end_ns - step.start_ns >= 30_000_000 for step in explicit.ranks[0].steps[3:])
    for batches, run in zip(kinds, runs, strict=False):
        assert "trained" in run.output and "Traceback" not in run.output, run.output[-3000:]
        rank = run.ranks[0]
        assert len(rank.steps) == 12  # 2 epochs of 6 batches; the evaluation forwards open none
        for step in rank.steps:
            names = sorted(span.name for span in rank.children.get(step.span_id, []))
            assert names == ["traceml.backward", "traceml.forward"], names
            assert step.attributes["traceml.optimizer.steps"] == 0
            waited = step.attributes.get("traceml.input_wait.cpu_duration")
            assert (waited is not None) == (batches == "loader")
        assert "per backward without an optimizer" in run.output
