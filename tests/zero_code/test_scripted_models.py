"""Zero-code tracing of a plain loop over a TorchScript model, which takes no forward hooks.

Step inference finds the outermost training forward with global module hooks during its warm-up,
then hooks the roots it found. A scripted root refuses hooks, so the global hooks stay (they still
see its calls): every update is a step with its forward, and nothing of ours reaches the script.
"""

from __future__ import annotations

from pathlib import Path

from tests.zero_code.runner import traceml_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_a_scripted_model_trains_and_every_inferred_step_has_its_forward(tmp_path: Path) -> None:
    run = traceml_run(tmp_path, SCRIPTS / "scripted_loop.py")
    assert "trained" in run.output and "Traceback" not in run.output, run.output[-3000:]
    assert "is not timed" not in run.output  # the global hooks time it
    rank = run.ranks[0]
    assert len(rank.steps) == 10
    for step in rank.steps:
        names = [span.name for span in rank.children.get(step.span_id, [])]
        assert names.count("traceml.forward") == 1 and names.count("traceml.optimizer") == 1, names
