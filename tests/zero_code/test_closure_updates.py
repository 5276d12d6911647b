"""Zero-code tracing of a loop whose every update takes a closure (``optimizer.step(closure)``).

With no DataLoader, telemetry starts at the first forward, which runs inside the first update, so the
hooks are installed in the middle of that ``step()`` call: its start was never seen. It still ends
the first step and counts as that step's update (untimed: no optimizer phase); later updates are
timed, with the closure's forward and backward as phases of their own.
"""

from __future__ import annotations

from pathlib import Path

from tests.zero_code.runner import traceml_runs_together

SCRIPT = Path(__file__).resolve().parent / "scripts" / "closure_loop.py"


def test_every_closure_update_is_a_step_with_its_update_counted(tmp_path: Path) -> None:
    optimizers = ("sgd", "lbfgs")
    for name in optimizers:
        (tmp_path / name).mkdir()
    runs = traceml_runs_together([(tmp_path / name, SCRIPT, (name,)) for name in optimizers])
    for optimizer, run in zip(optimizers, runs, strict=True):
        assert "trained" in run.output and "Traceback" not in run.output, run.output[-3000:]
        steps = run.ranks[0].steps
        assert len(steps) == 6
        assert [step.attributes["traceml.optimizer.steps"] for step in steps] == [1] * 6
        closure_calls = 1 if optimizer == "sgd" else 3
        for number, step in enumerate(steps):
            names = [span.name for span in run.ranks[0].children.get(step.span_id, [])]
            assert names.count("traceml.forward") >= 1 and names.count("traceml.backward") >= 1, names
            assert names.count("traceml.optimizer") == (0 if number == 0 else 1), (number, names)
            if number:
                assert names.count("traceml.forward") <= closure_calls
        assert "6 optimizer updates" in run.output
