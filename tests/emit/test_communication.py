"""Exposed collective time from measured intervals, and the bounded collective spans of a step."""

from __future__ import annotations

import pytest

from tests.ports import free_port
from traceml_otel import contract as c
from traceml_otel.emit.exposed_communication import overlapped_tail, step_exposures
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder
from traceml_otel.step_records import CollectiveTiming, PhaseTiming, StepRecord

MS = 1_000_000


def _builder() -> StepSpanBuilder:
    return StepSpanBuilder(RankInfo(run_id="r", rank=1, local_rank=1, world_size=2, node_rank=0, host="h"))


def _bucket(start_ms: float, end_ms: float | None, nbytes: int = 1000, **gpu: int) -> CollectiveTiming:
    end = None if end_ms is None else int(end_ms * MS)
    return CollectiveTiming("all_reduce", "ddp", int(start_ms * MS), end, nbytes, False, **gpu)


def _record(*collectives: CollectiveTiming, phases=None, gpu_duration_ns=None) -> StepRecord:
    phases = phases or (
        PhaseTiming("forward", 0, 1 * MS, 3 * MS),
        PhaseTiming("backward", 0, 3 * MS, 10 * MS),
        PhaseTiming("optimizer", 0, 10 * MS, 11 * MS),
    )
    return StepRecord(step=4, start_ns=0, end_ns=12 * MS, phases=phases, collectives=collectives,
                      gpu_duration_ns=gpu_duration_ns)


def test_overlapped_tail_is_the_time_after_the_last_hand_over() -> None:
    assert overlapped_tail([(0, 5), (2, 9), (6, 8)]) == [0, 1, 2]  # 9 - 6, split by completion order
    assert overlapped_tail([(0, 2), (6, 6)]) == [0, 0]  # all done when the last one started
    assert overlapped_tail([(0, 5), (1, None)]) is None  # unknown end: nothing guessed


def test_ddp_buckets_expose_only_what_outlasts_the_last_gradient() -> None:
    record = _record(_bucket(4, 7), _bucket(6, 9.5), _bucket(8, 9))
    exposures = step_exposures(record)
    assert [e.exposed_ns for e in exposures] == [0, MS // 2, MS]  # 9.5 - 8 in all
    assert all(e.phase is record.phases[1] for e in exposures)  # inside backward


def test_each_backward_call_is_its_own_reduction() -> None:
    phases = (
        PhaseTiming("backward", 0, 0, 5 * MS),
        PhaseTiming("backward", 1, 5 * MS, 10 * MS),
    )
    record = _record(_bucket(1, 4), _bucket(3, 5), _bucket(6, 8), _bucket(7, 9), phases=phases)
    exposed = [e.exposed_ns for e in step_exposures(record)]
    assert exposed == [MS, MS, MS, MS]  # (5 - 3) + (9 - 7), not (9 - 7) once for the whole step


def test_blocking_calls_are_all_exposed_and_async_ones_unknown() -> None:
    blocking = CollectiveTiming("barrier", "api", 11 * MS, int(11.5 * MS), 0, True)
    waiting = CollectiveTiming("all_reduce", "api", 2 * MS, 4 * MS, 8, False)
    exposures = step_exposures(_record(blocking, waiting))
    assert exposures[0].exposed_ns == MS // 2 and exposures[0].phase is None  # after the optimizer
    assert exposures[1].exposed_ns is None and exposures[1].phase.phase == "forward"


def test_gpu_exposure_uses_the_events() -> None:
    record = _record(
        _bucket(4, 5, gpu_offset_ns=4 * MS, gpu_duration_ns=2 * MS),
        _bucket(6, 7, gpu_offset_ns=7 * MS, gpu_duration_ns=3 * MS),
        gpu_duration_ns=13 * MS,
    )
    assert [e.exposed_gpu_ns for e in step_exposures(record)] == [0, 3 * MS]


def test_a_hundred_buckets_make_one_span_with_totals() -> None:
    buckets = [_bucket(3 + i * 0.05, 3.2 + i * 0.05, nbytes=100) for i in range(100)]
    barrier = CollectiveTiming("barrier", "api", 11 * MS, 11 * MS + 5000, 0, True)
    spans = _builder().build(_record(*buckets, barrier))
    assert len(spans.collectives) == 2  # one per (source, kind), not one per bucket
    ddp = next(s for s in spans.collectives if s.attributes[c.ATTR_COLLECTIVE_SOURCE] == "ddp")
    assert ddp.name == c.SPAN_COLLECTIVE and ddp.parent_span_id == spans.step.span_id
    assert ddp.attributes[c.ATTR_COLLECTIVE_CALLS] == 100
    assert ddp.attributes[c.ATTR_COLLECTIVE_BYTES] == 10_000
    assert ddp.attributes[c.ATTR_COLLECTIVE_CPU] == pytest.approx(100 * 0.0002)
    assert ddp.attributes[c.ATTR_COLLECTIVE_EXPOSED_CPU] == pytest.approx(0.0002)
    assert c.ATTR_COLLECTIVE_GPU not in ddp.attributes  # CPU run: absent, not zero
    assert ddp.start_ns == 3 * MS and ddp.end_ns == int((3.2 + 99 * 0.05) * MS)
    step = spans.step.attributes
    assert step[c.ATTR_COMM_CALLS] == 101 and step[c.ATTR_COMM_BYTES] == 10_000
    assert step[c.ATTR_COMM_EXPOSED_CPU] == pytest.approx(0.0002 + 0.000005)
    backward = next(p for p in spans.phases if p.attributes[c.ATTR_PHASE_NAME] == "backward")
    assert backward.attributes[c.ATTR_PHASE_COMM_EXPOSED_CPU] == pytest.approx(0.0002)
    forward = next(p for p in spans.phases if p.attributes[c.ATTR_PHASE_NAME] == "forward")
    assert c.ATTR_PHASE_COMM_EXPOSED_CPU not in forward.attributes


def test_unknown_exposure_is_left_out_and_no_collectives_add_nothing() -> None:
    waiting = CollectiveTiming("all_gather", "api", 2 * MS, 4 * MS, 8, False)
    step = _builder().build(_record(waiting)).step.attributes
    assert step[c.ATTR_COMM_CALLS] == 1 and c.ATTR_COMM_EXPOSED_CPU not in step
    assert step[c.ATTR_COMM_CPU] == pytest.approx(0.002)
    quiet = _builder().build(_record())
    assert quiet.collectives == ()
    assert not any(key.startswith("traceml.communication") for key in quiet.step.attributes)


def test_collective_histograms_and_counters_are_served_for_prometheus() -> None:
    import urllib.request

    from traceml_otel.emit.step_metrics import (
        CollectiveSample,
        LiveState,
        PrometheusEndpoint,
        PrometheusStepMetrics,
        RankLabels,
    )

    port = free_port()
    state = LiveState(RankLabels("run-x", 3, 1, "h", "0"), lambda: 0)
    served = PrometheusStepMetrics(PrometheusEndpoint(port), state)
    try:
        for _ in range(2):  # two steps
            served.record_collectives([CollectiveSample("ddp", "all_reduce", 0.004, 0.001, 3, 3 << 20),
                                       CollectiveSample("api", "barrier", 0.002, None, 1, 0)])
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        served.close()
    lines = [line for line in text.splitlines() if line.startswith("traceml_collective_")]
    counts = [line for line in lines if line.startswith("traceml_collective_duration_seconds_count")]
    assert len(counts) == 2, lines
    ddp = next(line for line in counts if 'traceml_collective_source="ddp"' in line)
    assert 'traceml_collective_kind="all_reduce"' in ddp and 'traceml_rank="3"' in ddp
    assert ddp.endswith(" 2.0")
    exposed = [line for line in lines if line.startswith("traceml_collective_exposed_seconds_count")]
    assert len(exposed) == 1 and 'traceml_collective_kind="all_reduce"' in exposed[0]  # unmeasured: no series
    calls = {line.split("{")[0] + (" ddp" if '"ddp"' in line else " api"): float(line.rsplit(" ", 1)[1])
             for line in lines if line.startswith(("traceml_collective_calls", "traceml_collective_bytes"))}
    assert calls == {"traceml_collective_calls_total ddp": 6, "traceml_collective_calls_total api": 2,
                     "traceml_collective_bytes_total ddp": 6 << 20, "traceml_collective_bytes_total api": 0}


def test_collective_calls_and_bytes_are_counted_over_otlp() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from traceml_otel.emit.step_metrics import RankLabels, StepMetrics

    reader = InMemoryMetricReader()
    labels = RankLabels("run-x", 3, 1, "h", "0")
    metrics = StepMetrics(Resource.create({}), labels, None, metric_reader=reader)
    record = _record(*[_bucket(4 + i, 5 + i, nbytes=2048) for i in range(3)])
    for _ in range(2):
        metrics.record(record, _builder().build(record))
    data = reader.get_metrics_data()
    points = {m.name: list(m.data.data_points) for r in data.resource_metrics for sc in r.scope_metrics
              for m in sc.metrics}
    metrics.shutdown(1.0)
    (calls,) = points[c.METRIC_COLLECTIVE_CALLS]
    (nbytes,) = points[c.METRIC_COLLECTIVE_BYTES]
    assert calls.value == 6 and nbytes.value == 6 * 2048
    assert calls.attributes[c.ATTR_COLLECTIVE_SOURCE] == "ddp" and calls.attributes[c.ATTR_RANK] == 3
