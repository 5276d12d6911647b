"""The step model: spans folded into steps, missing versus zero, windows and clock selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, step_spans, write_run
from traceml_otel import contract as c
from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.kinds import Clock, StepKind
from traceml_otel.analyze.measures import rank_metrics, step_values
from traceml_otel.analyze.otlp_decode import decode_attributes
from traceml_otel.analyze.run_model import BACKWARD, FORWARD, H2D, OPTIMIZER, StepTiming, WindowSpec
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.analyze.window import aligned_window, group_by_rank, select_clock, select_window


def assemble(steps: list[SyntheticStep], run_id: str = "r1") -> list[StepTiming]:
    assembler = StepAssembler()
    for step in steps:
        for span in step_spans(run_id, step, 1_000 + step.step * 10**7):
            attrs = decode_attributes(span["attributes"], frozenset(a["key"] for a in span["attributes"]))
            assembler.add_span(span["name"], attrs, span)
    return assembler.steps(run_id)[0]


def test_several_calls_of_a_phase_are_summed() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, forward=0.006, forward_calls=3)])
    assert step.phase_calls[FORWARD] == 3
    assert step.phase(FORWARD, Clock.CPU) == pytest.approx(0.006)


def test_absent_optimizer_and_h2d_count_zero_but_forward_stays_missing() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, forward=None, optimizer=None, h2d=None)])
    assert step.phase(FORWARD, Clock.CPU) is None and step.phase(OPTIMIZER, Clock.CPU) is None
    values = step_values(step, Clock.CPU)
    assert values.forward is None and values.compute is None and values.residual is None
    assert values.optimizer == 0.0 and values.h2d == 0.0


def test_measured_zero_stays_zero() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, input_wait=0.0, optimizer=0.0)])
    assert step.input_wait_cpu == 0.0
    assert step.phase(OPTIMIZER, Clock.CPU) == 0.0
    metrics, _ = rank_metrics(0, [step], Clock.CPU)
    assert metrics.input_wait == 0.0


def test_absent_input_wait_is_missing_for_the_whole_rank() -> None:
    steps = assemble([SyntheticStep(rank=0, step=n, input_wait=None if n == 3 else 0.01) for n in range(10)])
    metrics, seconds = rank_metrics(0, steps, Clock.CPU)
    assert metrics.input_wait is None and metrics.step_time is None
    assert metrics.traced is not None
    assert seconds[3] == pytest.approx(steps[3].traced_cpu)  # the traced time stands in per step


def test_residual_is_traced_minus_h2d_and_compute_clamped_at_zero() -> None:
    steps = assemble(
        [
            SyntheticStep(
                rank=0, step=0, forward=0.01, backward=0.02, optimizer=0.005, h2d=0.002, residual=0.003
            ),
            SyntheticStep(rank=0, step=1, traced=0.01, forward=0.01, backward=0.02, optimizer=0.0),
        ]
    )
    metrics, _ = rank_metrics(0, steps, Clock.CPU)
    assert metrics.residual == pytest.approx((0.003 + 0.0) / 2)


def test_prefetch_h2d_counts_toward_h2d_and_step_time_but_not_residual() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, input_wait=0.01, h2d=0.002, prefetch_h2d=0.004)])
    values = step_values(step, Clock.CPU)
    assert values.h2d == pytest.approx(0.006) and values.h2d_in_step == pytest.approx(0.002)
    assert values.step_time == pytest.approx(0.01 + step.traced_cpu + 0.004)
    assert values.residual == pytest.approx(0.0005)


def test_gradient_accumulation_micro_steps(tmp_path: Path) -> None:
    steps = [
        SyntheticStep(
            rank=0, step=n, optimizer=0.001 if n % 4 == 3 else None, optimizer_steps=1 if n % 4 == 3 else 0
        )
        for n in range(40)
    ]
    analysis = analyze_run(FileSpanSource([write_run(tmp_path / "run", "r", steps)]).load())
    assert analysis.accumulation.optimizer_updates == 10
    assert analysis.accumulation.micro_steps == 30
    assert analysis.accumulation.steps_per_update == pytest.approx(4.0)


# --- clock selection ------------------------------------------------------------------------


def window_of(steps: list[StepTiming]):  # type: ignore[no-untyped-def]
    return aligned_window(group_by_rank(steps))


def test_gpu_clock_when_every_step_has_gpu_timings() -> None:
    steps = assemble([SyntheticStep(rank=r, step=n, gpu=True, h2d=0.001) for r in range(2) for n in range(5)])
    assert select_clock(window_of(steps)) is Clock.GPU


def test_cpu_clock_when_one_step_lacks_a_gpu_input_wait() -> None:
    steps = assemble([SyntheticStep(rank=0, step=n, gpu=True) for n in range(5)])
    steps[2] = steps[2]._replace(input_wait_gpu=None)
    assert select_clock(window_of(steps)) is Clock.CPU


def test_cpu_clock_when_a_present_phase_lacks_gpu_timing_but_absent_phases_do_not_matter() -> None:
    steps = assemble([SyntheticStep(rank=0, step=n, gpu=True, h2d=None) for n in range(5)])
    assert select_clock(window_of(steps)) is Clock.GPU  # no h2d call anywhere: no GPU timing needed
    gpu = list(steps[1].phase_gpu)
    gpu[BACKWARD] = None
    steps[1] = steps[1]._replace(phase_gpu=tuple(gpu))
    assert select_clock(window_of(steps)) is Clock.CPU


def test_clock_is_chosen_per_window(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, gpu=n >= 10) for n in range(30)]
    loaded = FileSpanSource([write_run(tmp_path / "run", "r", steps)]).load()
    assert analyze_run(loaded).clock is Clock.CPU
    assert analyze_run(loaded, WindowSpec(last=20)).clock is Clock.GPU


def test_phase_values_follow_the_selected_clock() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, gpu=True)])
    step = step._replace(phase_gpu=(0.5, 0.6, 0.1, None))
    assert step_values(step, Clock.GPU).forward == 0.5
    assert step_values(step, Clock.CPU).forward == pytest.approx(0.004)
    assert step.phase(H2D, Clock.GPU) is None


# --- windows ------------------------------------------------------------------------------------


def test_window_keeps_only_steps_every_rank_completed() -> None:
    steps = assemble(
        [SyntheticStep(rank=0, step=n) for n in range(10)]
        + [SyntheticStep(rank=1, step=n) for n in range(2, 12)]
        + [SyntheticStep(rank=1, step=12, error="RuntimeError")]
    )
    window = window_of(steps)
    assert window.ranks == (0, 1)
    assert window.step_numbers == tuple(range(2, 10))


@pytest.mark.parametrize(
    ("spec", "first", "last", "count"),
    [
        (WindowSpec(), 0, 49, 50),
        (WindowSpec(last=10), 40, 49, 10),
        (WindowSpec(last=500), 0, 49, 50),
        (WindowSpec(first_step=5, last_step=14), 5, 14, 10),
        (WindowSpec(first_step=45), 45, 49, 5),
    ],
)
def test_window_specs(spec: WindowSpec, first: int, last: int, count: int) -> None:
    steps = assemble([SyntheticStep(rank=0, step=n) for n in range(50)])
    window, info = select_window(window_of(steps), spec)
    assert (info.first_step, info.last_step, info.steps, window.steps) == (first, last, count, count)
    assert info.mode == spec.mode


def test_window_spec_validation() -> None:
    with pytest.raises(ValueError):
        WindowSpec(last=0)
    with pytest.raises(ValueError):
        WindowSpec(last=5, first_step=1)


def test_window_changes_the_verdict(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, input_wait=0.05 if n >= 40 else 0.0005) for n in range(60)]
    loaded = FileSpanSource([write_run(tmp_path / "run", "r", steps)]).load()
    assert (
        analyze_run(loaded, WindowSpec(first_step=0, last_step=39)).step.primary.kind
        is StepKind.COMPUTE_BOUND
    )
    assert analyze_run(loaded, WindowSpec(last=20)).step.primary.kind is StepKind.INPUT_BOUND


def test_every_traceml_span_name_comes_from_the_contract() -> None:
    (step,) = assemble([SyntheticStep(rank=0, step=0, h2d=0.001)])
    assert step.phase_calls == (1, 1, 1, 1)
    assert set(c.SPAN_NAME_TO_PHASE) == {f"traceml.{p}" for p in c.PHASES}


@pytest.mark.parametrize("clock", [Clock.CPU, Clock.GPU])
def test_the_per_step_values_and_the_rank_means_share_their_formulas(clock: Clock) -> None:
    """The slowest-steps table (step_values) and the per-rank means (rank_metrics) agree on every
    component: steps with DDP waits inside backward, loader-side copies and copies in the block."""
    steps = assemble([
        SyntheticStep(rank=0, step=n, gpu=True, ddp_wait=0.002 if n % 2 else None, h2d=0.0005,
                      prefetch_h2d=0.001 if n % 3 else None, residual=0.0001 * n,
                      optimizer=0.001 + 0.0001 * n)
        for n in range(12)
    ])
    metrics, seconds = rank_metrics(0, steps, clock)
    values = [step_values(step, clock) for step in steps]
    assert seconds == pytest.approx([v.step_time for v in values])
    for name in ("step_time", "input_wait", "traced", "forward", "backward", "optimizer", "h2d", "compute",
                 "residual", "communication"):
        per_step = [getattr(v, name) for v in values]
        assert getattr(metrics, name) == pytest.approx(sum(per_step) / len(per_step)), name
    assert metrics.communication > 0 and metrics.residual > 0
