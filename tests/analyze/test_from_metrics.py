"""The metric path's arithmetic (from_metrics.py): engine sums become the span reader's RankTotals,
and the same rules decide. The live comparison with the span reader is test_prometheus_parity.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.analyze.test_analyze_backends import analyze_args
from traceml_otel.analyze.from_metrics import analyze_metrics, infer_parallelism, rank_totals
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.measures import residual_time
from traceml_otel.analyze.sources.prometheus import MetricRun, PrometheusReader, RankCounters
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.cli.analyze import run_analyze

STEPS = 40


def counters(rank: int = 0, *, wait: float = 0.4, forward: float = 2.0, backward: float = 4.0,
             optimizer: float = 1.0, traced: float = 8.0, wait_steps: int = STEPS, forward_calls: int = STEPS,
             exposed: tuple[tuple[str, float], ...] = (), sources: tuple[str, ...] = ()) -> RankCounters:
    return RankCounters(
        rank=rank, steps=STEPS, traced=traced, input_wait=wait, input_wait_steps=wait_steps,
        phase_time=(forward, backward, optimizer, 0.0), phase_calls=(forward_calls, STEPS, STEPS, 0),
        exposed_by_source=exposed, collective_sources=sources,
        collective_time=sum(v for _, v in exposed) or None,
    )


def test_sums_become_the_span_readers_means() -> None:
    totals = rank_totals(counters())
    means = totals.means()
    assert means.steps == STEPS
    assert means.step_time == pytest.approx((8.0 + 0.4) / STEPS)
    assert means.compute == pytest.approx(7.0 / STEPS)
    assert means.residual == pytest.approx(residual_time(8.0, 0.0, 7.0, 0.0) / STEPS)
    assert means.communication is None and not means.communication_measured


def test_ddp_gradient_wait_is_taken_out_of_backward_once() -> None:
    means = rank_totals(counters(exposed=(("ddp", 1.5),), sources=("ddp",))).means()
    assert means.backward == pytest.approx(2.5 / STEPS)
    assert means.communication == pytest.approx(1.5 / STEPS)
    # traced 8 = forward 2 + backward 2.5 + wait 1.5 + optimizer 1 + residual 1: the wait counts once
    assert means.residual == pytest.approx(1.0 / STEPS)


def test_a_signal_missing_on_some_steps_is_unavailable_not_zero() -> None:
    assert rank_totals(counters(wait_steps=STEPS - 1)).means().input_wait is None
    missing_forward = rank_totals(counters(forward_calls=0)).means()
    assert missing_forward.forward is None and missing_forward.compute is None
    run = MetricRun("r", "Prometheus x", (counters(forward_calls=0),))
    assert analyze_metrics(run).step.primary.kind is StepKind.INCOMPLETE_DATA


def test_parallelism_is_read_from_the_collectives_seen() -> None:
    assert infer_parallelism((counters(0), counters(1))) == "independent"
    assert infer_parallelism((counters(0),)) == "none"
    assert infer_parallelism((counters(0, sources=("api",)), counters(1, sources=("api",)))) == "none"
    assert infer_parallelism((counters(0, exposed=(("ddp", 1.0),), sources=("ddp",)),)) == "ddp"


def test_input_bound_from_sums() -> None:
    run = MetricRun("r", "Prometheus x", (counters(wait=6.0), counters(1, wait=6.2)))
    analysis = analyze_metrics(run)
    assert analysis.step.primary.kind is StepKind.INPUT_BOUND
    assert analysis.run.parallelism == "independent"
    assert "not available from metrics" in " ".join(analysis.run.warnings)


def test_time_between_steps_from_the_wall_time_between_scrapes() -> None:
    """No fetch timed: the wall time between step ends, less the traced time, is the time between
    steps; unknown (a run inside one scrape interval), compute-bound is not claimed."""
    unmeasured = counters(wait=0.0, wait_steps=0, traced=7.0)  # 7 s traced over 40 steps
    slow = replace(unmeasured, between_steps=3.9, between_steps_counted=39)  # 0.1 s a step between
    analysis = analyze_metrics(MetricRun("r", "Prometheus x", (slow,)))
    assert analysis.step.primary.kind is StepKind.BETWEEN_STEPS
    assert analysis.ranks[0].between_steps == pytest.approx(0.1)
    assert analysis.step.primary.score == pytest.approx(0.1 / (0.1 + 7.0 / STEPS))
    quick = replace(unmeasured, between_steps=0.039, between_steps_counted=39)
    quick_run = MetricRun("r", "Prometheus x", (quick,))
    assert analyze_metrics(quick_run).step.primary.kind is StepKind.COMPUTE_BOUND
    unknown = analyze_metrics(MetricRun("r", "Prometheus x", (unmeasured,)))
    assert unknown.step.primary.kind is StepKind.INCOMPLETE_DATA
    assert "fewer than two scrapes saw their steps" in " ".join(unknown.run.warnings)


def test_totals_are_differences_of_cumulative_series_not_increase() -> None:
    reader = PrometheusReader("http://x", run_id='a"b', when=TimeRange(1000.0, 4600.0))
    query = reader.total("traceml_steps_total", since_offset_s=3600.5)
    assert 'traceml_run_id="a\\"b"' in query and "increase" not in query and "rate" not in query
    # each side reads one lookback window (not the whole range): the end value minus the value at --since
    assert "[300s] offset 3600500ms" in query and " or " in query
    assert " offset " not in reader.total("traceml_steps_total")  # no offset: the end value alone


@pytest.mark.parametrize(("extra", "message"), [
    (("--window", "10"), "not a step window"),
    ((), "needs --run-id"),
])
def test_prometheus_arguments_are_checked(capsys, extra, message) -> None:
    args = ["--prometheus", "http://127.0.0.1:9", *extra] + (["--run-id", "r"] if extra else [])
    assert run_analyze(analyze_args(*args)) == 2
    assert message in capsys.readouterr().err


def _communicating(rank: int, exposed: float, calls: float, per_call: float) -> RankCounters:
    return replace(counters(rank, exposed=(("ddp", exposed),), sources=("ddp",)),
                   collective_calls=calls, collective_bytes=calls * per_call)


@pytest.mark.parametrize(("calls", "per_call", "regime"), [(48 * STEPS, 4, "latency"),
                                                            (3 * STEPS, 8 << 20, "bandwidth")])
def test_the_call_and_byte_counters_give_the_regime(calls: int, per_call: int, regime: str) -> None:
    run = MetricRun("r", "Prometheus x", tuple(_communicating(r, 2.0, calls, per_call) for r in (0, 1)))
    primary = analyze_metrics(run).step.primary
    assert primary.kind is StepKind.COMMUNICATION_BOUND
    assert {e.name: e.value for e in primary.evidence}["regime"] == regime
    assert ("fewer, larger collectives" in primary.next) == (regime == "latency")


def test_one_rank_waiting_for_the_other_is_its_straggler_not_communication() -> None:
    run = MetricRun("r", "Prometheus x", (_communicating(0, 2.0, 120, 8 << 20),
                                          _communicating(1, 0.1, 120, 8 << 20)))
    step = analyze_metrics(run).step
    assert step.primary.kind.name.endswith("STRAGGLER")
    evidence = {e.name: e.value for e in step.primary.evidence}
    assert evidence["culprit_rank"] == 1 and evidence["split_basis"] == "least-waiting rank"
    assert not any(f.kind is StepKind.COMMUNICATION_BOUND for f in step.issues)
