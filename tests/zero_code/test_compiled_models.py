"""torch.compile'd models under ``traceml run``: none of our hooks is compiled, nothing recompiles.

One run of ``scripts/compiled_loop.py`` (~5 s): plain loops over ``torch.compile(model)`` and over
a model compiled in place (``model.compile()``) with steps inferred, then ``trace_step(model)``
where the traced model's hooks sit inside a ``fullgraph=True`` compiled region (the inner model of
``torch.compile(model)``, and a model compiled in place), which crashed training before (Dynamo
cannot trace ``get_ident``/``perf_counter_ns``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.zero_code.runner import ZeroCodeRun, traceml_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
STEPS = 6
SKEW_NS = 50_000_000  # the script's wall clock against the spans' (see test_inferred_steps.SKEW_NS)
GLOBAL_HOOKS_WARNING = "Using `torch.compile(module)` when there are global hooks on modules"


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ZeroCodeRun, dict]:
    tmp = tmp_path_factory.mktemp("compiled")
    run = traceml_run(tmp, SCRIPTS / "compiled_loop.py", str(tmp / "result.json"))
    return run, json.loads((tmp / "result.json").read_text())


def test_each_compiled_model_compiles_once_with_no_graph_break(compiled_run) -> None:
    """Step inference's warm-up ends before ``torch.compile(model)`` compiles (its global hooks would
    otherwise fail the compiled code's guards when removed: a recompile), and our hooks inside
    compiled regions are folded away by Dynamo (no graph break, no crash under fullgraph=True)."""
    _, result = compiled_run
    assert result["compiles"] == {"inferred": 1, "inferred_in_place": 1, "inner": 1, "in_place": 1}
    assert result["graph_breaks"] == {}


def test_only_torchs_global_hook_warning_and_only_on_the_first_call(compiled_run) -> None:
    """No Dynamo warning from our hooks; torch's own warning about global module hooks fires on the
    wrapper's first call only (zero-code's arming hook is there), never once the warm-up ended."""
    run, result = compiled_run
    assert len(result["warnings"]) == 1, result["warnings"]
    assert GLOBAL_HOOKS_WARNING in result["warnings"][0]
    assert "get_ident" not in run.output and "Graph break" not in run.output


@pytest.mark.parametrize("window", ["window", "window_in_place"])
def test_steps_of_the_compiled_loops_are_still_inferred_with_one_forward_each(compiled_run, window) -> None:
    run, result = compiled_run
    start, end = result[window]
    rank = run.ranks[0]
    inferred = [s for s in rank.steps if start - SKEW_NS <= s.start_ns and s.end_ns <= end + SKEW_NS]
    assert len(inferred) == STEPS
    for step in inferred:
        assert rank.phases(step).count("forward") == 1, rank.phases(step)
        assert "optimizer" in rank.phases(step)
    assert len(rank.steps) == 4 * STEPS  # and the trace_step phase lost no step


@pytest.mark.parametrize(("window", "forwards"), [("window_inner", 0), ("window_explicit_in_place", 1)])
def test_trace_step_times_the_forward_of_what_it_is_given(compiled_run, window, forwards) -> None:
    """``trace_step(model)`` for a model compiled in place: its class's call runs outside the compiled
    call, so the forward is timed. The inner model of ``torch.compile(model)``: its call is inside the
    compiled region, where our timing does nothing (its time is residual, as the README says)."""
    run, result = compiled_run
    start, end = result[window]
    rank = run.ranks[0]
    steps = [s for s in rank.steps if start - SKEW_NS <= s.start_ns and s.end_ns <= end + SKEW_NS]
    assert len(steps) == STEPS
    assert [rank.phases(step).count("forward") for step in steps] == [forwards] * STEPS
