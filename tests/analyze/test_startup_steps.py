"""Start-up steps (a compile, first allocations) leave the verdict's means, in both engines and the live
view; the report says which and how long they took; a slow step later in the run stays in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.run_model import WindowSpec
from traceml_otel.analyze.startup_steps import MAX_SHARE, STARTUP_FACTOR, startup_steps
from traceml_otel.report.html import render_html
from traceml_otel.report.text import render_text


def test_leading_steps_ten_times_the_median_are_start_up_and_nothing_after() -> None:
    steady = [0.002] * 380
    assert startup_steps([15.0, *steady]) == 1
    assert startup_steps([15.0, 0.021, *steady]) == 2  # a second compile (backward, a new shape)
    assert startup_steps([15.0, 0.019, 0.021, *steady]) == 1  # only the leading run of them
    assert startup_steps([0.002, 15.0, *steady]) == 0  # a slow step after an ordinary one is the run's
    assert startup_steps([0.002 * STARTUP_FACTOR * 0.99, *steady]) == 0
    assert startup_steps([15.0] * 19) == 0  # too few steps to tell the typical one
    assert startup_steps([15.0] * 100 + steady) == int(480 * MAX_SHARE)  # at most a tenth of the window
    assert startup_steps([None, *steady]) == 0  # an untimed step is not start-up
    assert startup_steps([]) == 0


def _compiled_run(compile_s: float) -> list[SyntheticStep]:
    """Two ranks whose ordinary 2 ms steps wait 0.4 ms for input (16 %, INPUT_BOUND); step 0's forward
    compiles for ``compile_s``."""
    return [SyntheticStep(rank=rank, step=n, world_size=2, parallelism="ddp", input_wait=0.0004,
                          forward=0.0006 + (compile_s if n == 0 else 0.0), backward=0.0007, optimizer=0.0002,
                          residual=0.0001)
            for rank in range(2) for n in range(200)]


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_a_compile_step_leaves_the_verdict_and_the_report_says_so(tmp_path: Path, engine: str) -> None:
    run_dir = write_run(tmp_path / "run", "run-compiled", _compiled_run(15.0))
    analysis = analyze_path([run_dir], engine=engine)
    assert str(analysis.step.primary.kind) == "INPUT_BOUND", analysis.step.primary
    window = analysis.window
    assert (window.startup_steps, window.startup_last_step, window.left_out_steps) == (1, 0, 1)
    assert window.startup_s == pytest.approx(15.002, abs=0.01)
    assert analysis.ranks[0].steps == 199 and analysis.ranks[0].forward == pytest.approx(0.0006, rel=0.05)
    text = render_text(analysis)
    assert "start-up: step 0 took 15.00 s" in text and "left out of the means and the verdict" in text
    assert "start-up: step 0 took" in render_html(analysis)
    plain = analyze_path([write_run(tmp_path / "plain", "run-plain", _compiled_run(0.0))], engine=engine)
    assert plain.window.startup_steps == 0 and "start-up" not in render_text(plain)
    assert str(plain.step.primary.kind) == str(analysis.step.primary.kind)


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_a_window_that_starts_mid_run_keeps_its_first_steps(tmp_path: Path, engine: str) -> None:
    """A slow step at the start of ``--step-range`` is the run's own, not its start-up."""
    steps = [s if s.step != 100 else SyntheticStep(rank=s.rank, step=100, world_size=2, parallelism="ddp",
                                                   forward=0.05) for s in _compiled_run(0.0)]  # 26x
    run_dir = write_run(tmp_path / "run", "run-mid", steps)
    analysis = analyze_path([run_dir], engine=engine, window=WindowSpec(first_step=100, last_step=199))
    assert analysis.window.startup_steps == 0 and analysis.ranks[0].steps == 100
