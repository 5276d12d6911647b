"""The hand-aggregated histograms against the SDK's own instrument: the same measurements, read through
a real InMemoryMetricReader, give the same points (under both temporalities); and the step metrics'
histograms leave through the SDK's OTLP exporter with the temporality it prefers."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    Histogram,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan

from tests.integration.otlp_receiver import OtlpHttpReceiver
from traceml_otel import contract as c
from traceml_otel.emit.histogram_accumulator import CARDINALITY_LIMIT, HistogramGroup
from traceml_otel.emit.metric_merge import add_to_collection, histogram_temporality, merged
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder, sampled_context
from traceml_otel.emit.step_metrics import RankLabels, StepMetrics
from traceml_otel.step_records import PhaseTiming, StepRecord

DELTA, CUMULATIVE = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
SCOPE = InstrumentationScope("traceml-test", "1.0")
RANK = {c.ATTR_JOB: "j", c.ATTR_RUN_ID: "r", c.ATTR_RANK: 0}
BUCKETED, SUM_ONLY = "test.bucketed", "test.sum_only"


def attributes_of(key: str | None) -> dict[str, Any]:
    return dict(RANK) if key is None else {**RANK, c.ATTR_PHASE_NAME: key}


class Pair:
    """The SDK's histograms and ours, each read by its own in-memory reader, fed the same values."""

    def __init__(self, temporality: AggregationTemporality, exemplars: str = "trace_based") -> None:
        preference = {Histogram: temporality}
        self.sdk_reader = InMemoryMetricReader(preferred_temporality=preference)
        self.sdk = MeterProvider(
            metric_readers=[self.sdk_reader],
            views=[View(instrument_name=SUM_ONLY,
                        aggregation=ExplicitBucketHistogramAggregation(boundaries=()))],
            exemplar_filter=(TraceBasedExemplarFilter() if exemplars == "trace_based"
                             else AlwaysOffExemplarFilter()),
        )
        meter = self.sdk.get_meter(SCOPE.name, SCOPE.version)
        self.sdk_histograms = {
            BUCKETED: meter.create_histogram(BUCKETED, unit="s", description="d",
                                             explicit_bucket_boundaries_advisory=list(c.DURATION_BUCKETS_S)),
            SUM_ONLY: meter.create_histogram(SUM_ONLY, unit="s", description="d"),
        }
        self.our_reader = InMemoryMetricReader(preferred_temporality=preference)
        self.ours_provider = MeterProvider(metric_readers=[self.our_reader])
        self.group = HistogramGroup(histogram_temporality(self.our_reader), exemplars)
        self.ours = {
            BUCKETED: self.group.histogram(BUCKETED, "s", "d", c.DURATION_BUCKETS_S, attributes_of),
            SUM_ONLY: self.group.histogram(SUM_ONLY, "s", "d", (), attributes_of),
        }
        add_to_collection(self.our_reader, self.group.collect, Resource.create({}), SCOPE)
        self.trace_id = 0x5EED0000000000000000000000000001

    def feed(self, measurements: Iterable[tuple[str, str | None, float, bool]]) -> None:
        """(metric, series key, value, exemplar) each through both."""
        for name, key, value, exemplar in measurements:
            self.trace_id += 1
            ids = (self.trace_id, self.trace_id & 0xFFFFFFFF) if exemplar else (None, None)
            context = None
            if exemplar:
                context = trace.set_span_in_context(NonRecordingSpan(sampled_context(*ids)))
            self.sdk_histograms[name].record(value, attributes_of(key), context=context)
            self.ours[name].record(key, value, time.time_ns(), *ids)

    def collect(self) -> tuple[dict[str, Metric], dict[str, Metric]]:
        return _by_name(self.sdk_reader.get_metrics_data()), _by_name(self.our_reader.get_metrics_data())


def _by_name(data: Any) -> dict[str, Metric]:
    return {metric.name: metric for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics for metric in scope.metrics}


def _series(metric: Metric) -> dict[tuple, HistogramDataPoint]:
    return {tuple(sorted(point.attributes.items())): point for point in metric.data.data_points}


def assert_same(sdk: dict[str, Metric], ours: dict[str, Metric], started_ns: int) -> None:
    """Equal points, exemplars and metric fields; times within the test's window, in the same order."""
    names = {BUCKETED, SUM_ONLY}
    assert set(sdk) & names == set(ours) & names
    now = time.time_ns()
    for name in set(sdk) & names:
        ours_metric, sdk_metric = ours[name], sdk[name]
        assert (ours_metric.unit, ours_metric.description) == (sdk_metric.unit, sdk_metric.description)
        assert ours_metric.data.aggregation_temporality == sdk_metric.data.aggregation_temporality
        sdk_points, our_points = _series(sdk_metric), _series(ours_metric)
        assert sdk_points.keys() == our_points.keys()
        for attributes, expected in sdk_points.items():
            got = our_points[attributes]
            for field in ("attributes", "count", "sum", "bucket_counts", "explicit_bounds", "min", "max"):
                assert getattr(got, field) == getattr(expected, field), (name, attributes, field)
            assert [(e.trace_id, e.span_id, e.value, e.filtered_attributes) for e in got.exemplars] == [
                (e.trace_id, e.span_id, e.value, e.filtered_attributes) for e in expected.exemplars]
            for point in (got, expected):
                assert started_ns <= point.start_time_unix_nano <= point.time_unix_nano <= now
                assert all(started_ns <= e.time_unix_nano <= point.time_unix_nano for e in point.exemplars)


def intervals() -> Iterator[list[tuple[str, str | None, float, bool]]]:
    """Several series, boundary values, values no histogram takes, exemplars on some; an empty
    interval; series that stop and start."""
    yield []  # a collection before any measurement: no point, and a delta start is not moved by it
    on_bounds = (0.0004, 0.0005, 0.001, 0.002, 0.002, 0.0101, 75.0, 0.0)
    yield [(BUCKETED, None, v, v != 0.002) for v in on_bounds] + [
        (SUM_ONLY, "forward", 0.03, True), (SUM_ONLY, "backward", 0.05, False),
        (SUM_ONLY, "backward", 0.06, True), (SUM_ONLY, "optimizer", 0.01, False),
        (BUCKETED, None, math.nan, True), (BUCKETED, None, math.inf, True), (SUM_ONLY, "forward", -1.0, True),
        (BUCKETED, "forward", 0.3, True),
    ]
    yield []  # an empty interval: cumulative repeats the totals without exemplars, delta has no point
    yield [(BUCKETED, None, 0.001 * k, k % 3 == 0) for k in range(1, 40)] + [
        (SUM_ONLY, "backward", 0.07, True), (SUM_ONLY, "h2d", 0.002, True), (BUCKETED, None, 1e-9, False),
    ]
    yield [(SUM_ONLY, "forward", 0.1, False)]  # only a series seen two intervals ago; no exemplar


@pytest.mark.parametrize("temporality", [CUMULATIVE, DELTA], ids=["cumulative", "delta"])
def test_points_equal_the_sdk_instruments(temporality: AggregationTemporality) -> None:
    pair = Pair(temporality)
    started = time.time_ns()
    first_seen: dict[tuple, tuple[int, int]] = {}  # series: the window of its first interval
    recorded: set[str] = set()
    collect_window: tuple[int, int] | None = None  # around the previous collection
    for measurements in intervals():
        fed_at = time.time_ns()
        pair.feed(measurements)
        before_collect = time.time_ns()
        sdk, ours = pair.collect()
        assert_same(sdk, ours, started)
        for metrics in (sdk, ours):  # where each start lies, for the SDK and for us alike
            for name in {BUCKETED, SUM_ONLY} & set(metrics):
                for attributes, point in _series(metrics[name]).items():
                    window = first_seen.setdefault((name, attributes), (fed_at, before_collect))
                    if temporality is DELTA and name in recorded:  # from the previous collection on
                        assert collect_window is not None
                        window = collect_window
                    assert window[0] <= point.start_time_unix_nano <= window[1], (name, attributes)
        recorded |= {name for name, *_ in measurements}
        collect_window = (before_collect, time.time_ns())
    assert [pair.ours[BUCKETED].rejected, pair.ours[SUM_ONLY].rejected] == [2, 1]  # NaN, inf; -1


@pytest.mark.parametrize("temporality", [CUMULATIVE, DELTA], ids=["cumulative", "delta"])
def test_series_beyond_the_cardinality_limit_overflow_as_in_the_sdk(temporality) -> None:
    pair = Pair(temporality)
    started = time.time_ns()
    pair.feed([(SUM_ONLY, f"phase-{n}", 0.01 * (n % 7), n % 2 == 0) for n in range(CARDINALITY_LIMIT + 5)])
    sdk, ours = pair.collect()
    assert len(ours[SUM_ONLY].data.data_points) == CARDINALITY_LIMIT + 1  # the last five in one series
    assert_same(sdk, ours, started)  # the overflow exemplar keeps the measurement's attributes
    pair.feed([(SUM_ONLY, "late", 0.2, True)])
    assert_same(*pair.collect(), started)


def test_always_off_exemplar_filter_keeps_none() -> None:
    pair = Pair(CUMULATIVE, exemplars="always_off")
    started = time.time_ns()
    pair.feed([(BUCKETED, None, 0.01, True), (SUM_ONLY, "forward", 0.02, True)])
    sdk, ours = pair.collect()
    assert_same(sdk, ours, started)
    assert not ours[BUCKETED].data.data_points[0].exemplars


def test_merge_puts_ours_in_our_scope_or_adds_it() -> None:
    pair = Pair(CUMULATIVE)
    pair.feed([(BUCKETED, None, 0.01, True)])
    (ours_metric,) = pair.group.collect(time.time_ns())
    data = pair.sdk_reader.get_metrics_data()  # has the SDK's own BUCKETED in SCOPE: ours goes first
    (scope,) = merged(data, [ours_metric], Resource.create({}), SCOPE).resource_metrics[0].scope_metrics
    sdk_metrics = data.resource_metrics[0].scope_metrics[0].metrics
    assert scope.metrics[0] is ours_metric and scope.metrics[1:] == sdk_metrics
    other = InstrumentationScope("other")
    scopes = merged(data, [ours_metric], Resource.create({}), other).resource_metrics[0].scope_metrics
    assert [s.scope for s in scopes] == [SCOPE, other]
    (alone,) = merged(None, [ours_metric], Resource.create({"a": 1}), SCOPE).resource_metrics
    assert alone.resource.attributes["a"] == 1 and alone.scope_metrics[0].metrics == [ours_metric]
    assert merged(data, [], Resource.create({}), SCOPE) is data


@pytest.mark.parametrize("preference", ["cumulative", "delta"])
def test_step_histograms_leave_through_the_sdk_exporter(preference: str, monkeypatch) -> None:
    """StepMetrics with the SDK's OTLP/HTTP exporter: the histograms arrive (contract names, units,
    attributes, exemplars) in the temporality OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE asks."""
    with OtlpHttpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{receiver.endpoint}/v1/metrics")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", preference)
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only the final export
        labels = RankLabels(run_id="r1", rank=3, local_rank=1, host="node-a", version="9", job="nightly")
        metrics = StepMetrics(Resource.create({}), labels, "http/protobuf")
        built = [_step(n) for n in range(5)]
        metrics.record_batch((record, spans, n != 2) for n, (record, spans) in enumerate(built))
        metrics.shutdown(5.0)
        assert metrics.export_counts is not None and metrics.export_counts.exported == 1
        received = {m.metric.name: m.metric for m in receiver.metrics()}
    rank = {c.ATTR_JOB: "nightly", c.ATTR_RUN_ID: "r1", c.ATTR_RANK: 3}
    temporality = {"delta": DELTA, "cumulative": CUMULATIVE}[preference]
    step_hist = received[c.METRIC_STEP_DURATION]
    (point,) = step_hist.histogram.data_points
    assert step_hist.unit == "s" and int(step_hist.histogram.aggregation_temporality) == int(temporality)
    assert point.count == 5 and list(point.explicit_bounds) == list(c.DURATION_BUCKETS_S)
    assert _attributes(point.attributes) == rank
    traces = {int.from_bytes(e.trace_id, "big") for e in point.exemplars}
    assert traces and traces <= {spans.step.trace_id for n, (_, spans) in enumerate(built) if n != 2}
    phases = received[c.METRIC_PHASE_DURATION].histogram
    assert int(phases.aggregation_temporality) == int(temporality)
    by_phase = {_attributes(p.attributes)[c.ATTR_PHASE_NAME]: p for p in phases.data_points}
    assert sorted(by_phase) == ["backward", "forward"] and by_phase["forward"].sum == pytest.approx(0.15)
    assert _attributes(by_phase["forward"].attributes) == {**rank, c.ATTR_PHASE_NAME: "forward"}
    assert [len(p.bucket_counts) for p in by_phase.values()] == [1, 1]  # sum-only
    waits = received[c.METRIC_STEP_INPUT_WAIT].histogram.data_points
    assert [(p.count, list(p.explicit_bounds), len(p.bucket_counts)) for p in waits] == [(5, [], 1)]
    assert received[c.METRIC_STEPS].sum.data_points[0].as_int == 5


def _step(n: int) -> tuple[StepRecord, Any]:
    """Step ``n``: 0.1 s plus n ms, a 30 ms forward, a 50 ms backward, a 20 ms input wait."""
    start = 1_700_000_000 * 10**9 + n * 10**9
    ms = 10**6
    phases = (PhaseTiming("forward", 0, start, start + 30 * ms),
              PhaseTiming("backward", 0, start + 30 * ms, start + 80 * ms))
    record = StepRecord(step=n, start_ns=start, end_ns=start + 100 * ms + n * ms, input_wait_ns=20 * ms,
                        input_fetches=1, phases=phases)
    builder = StepSpanBuilder(RankInfo(run_id="r1", rank=3, local_rank=1, world_size=4, node_rank=0,
                                       host="h"))
    return record, builder.build(record)


def _attributes(pairs: Any) -> dict[str, Any]:
    out = {}
    for kv in pairs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def test_an_sdk_without_the_collect_seam_turns_metrics_off(tmp_path, monkeypatch) -> None:
    """If a future SDK stops wiring readers through ``_set_collect_callback``, the histograms cannot
    join its collection: the emitter says metrics are off (not a silent export without them)."""
    from opentelemetry.sdk.metrics.export import MetricReader

    from tests.emit.test_emitter_faults import _hello, _rows
    from traceml_otel.emit.worker import Emitter

    monkeypatch.setattr(MetricReader, "_set_collect_callback", lambda self, func: None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    emitter = Emitter(_hello(tmp_path, prometheus_port=port, metrics_endpoint="http://127.0.0.1:9",
                             metrics_protocol="http/protobuf"))
    assert emitter.metrics is None and "no _collect callback" in emitter.stats.outputs_disabled["metrics"]
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # the scrape endpoint it had opened is closed again
    emitter.handle_steps(_rows(0, 3))
    emitter.finish("ok", 0, True, steps_traced=3)
    assert emitter.stats.steps_local == 3 and emitter.stats.metrics_skipped_steps == 3  # the rest goes on


def test_a_batch_of_collective_steps_counts_and_times_every_step() -> None:
    """record_batch: the collective histograms get one measurement per step and (source, kind), the
    call and byte counters the batch's totals (added once)."""
    from tests.emit.test_communication import _bucket, _builder, _record

    reader = InMemoryMetricReader()
    labels = RankLabels("run-x", 3, 1, "h", "0")
    metrics = StepMetrics(Resource.create({}), labels, None, metric_reader=reader)
    record = _record(*[_bucket(4 + i, 5 + i, nbytes=2048) for i in range(3)])
    spans = _builder().build(record)
    metrics.record_batch([(record, spans, True)] * 5)
    points = {m.name: list(m.data.data_points) for r in reader.get_metrics_data().resource_metrics
              for sc in r.scope_metrics for m in sc.metrics}
    metrics.shutdown(1.0)
    (calls,), (nbytes,) = points[c.METRIC_COLLECTIVE_CALLS], points[c.METRIC_COLLECTIVE_BYTES]
    assert (calls.value, nbytes.value) == (15, 15 * 2048)
    (duration,) = points[c.METRIC_COLLECTIVE_DURATION]
    assert duration.count == 5 and duration.sum == pytest.approx(5 * 0.003)  # 3 buckets of 1 ms a step
    assert duration.attributes == {c.ATTR_JOB: "run-x", c.ATTR_RUN_ID: "run-x", c.ATTR_RANK: 3,
                                   c.ATTR_COLLECTIVE_SOURCE: "ddp", c.ATTR_COLLECTIVE_KIND: "all_reduce"}
    assert {e.trace_id for e in duration.exemplars} == {spans.step.trace_id}


@pytest.mark.parametrize("exemplars", ["trace_based", "always_on", "always_off"])
@pytest.mark.parametrize("temporality", [DELTA, CUMULATIVE])
def test_a_column_at_a_time_leaves_the_same_series_as_one_at_a_time(
        exemplars: str, temporality: AggregationTemporality) -> None:
    """``record_many`` (the step metrics' batch path) against ``record`` of each value in order, on
    random batches: boundaries hit exactly, zeros, a NaN, an infinity or a negative among them, steps
    sampled or not, several keys, and more keys than the cardinality limit."""
    import random

    rng = random.Random(7)
    boundaries = c.DURATION_BUCKETS_S
    odd = [math.nan, math.inf, -1.0, -0.0, 0.0, *boundaries[:4], 1e308]

    def one_batch() -> list[tuple[str, list[float], list[tuple[int, int] | None]]]:
        batches = []
        for key in rng.sample(["forward", "backward", "optimizer", "h2d"], rng.randint(1, 4)):
            size = rng.randint(1, 40)
            values = [rng.choice(odd) if rng.random() < 0.05 else rng.lognormvariate(-6, 2)
                      for _ in range(size)]
            mode = rng.random()
            ids: list[tuple[int, int] | None] = [
                (rng.getrandbits(128), rng.getrandbits(64))
                if mode < 0.4 or (mode < 0.7 and rng.random() < 0.5) else None for _ in range(size)]
            batches.append((key, values, ids))
        return batches

    one_by_one = HistogramGroup(temporality, exemplars)
    columns = HistogramGroup(temporality, exemplars)
    seq = one_by_one.histogram(BUCKETED, "s", "d", boundaries, attributes_of)
    col = columns.histogram(BUCKETED, "s", "d", boundaries, attributes_of)
    seq_sum = one_by_one.histogram(SUM_ONLY, "s", "d", (), attributes_of)
    col_sum = columns.histogram(SUM_ONLY, "s", "d", (), attributes_of)
    now = 1_000_000_000
    for interval in range(30):
        for _ in range(5):
            now += 1000
            for key, values, ids in one_batch():
                for a, b in ((seq, col), (seq_sum, col_sum)):
                    for value, pair in zip(values, ids, strict=True):
                        a.record(key, value, now, *(pair or (None, None)))
                    b.record_many(key, values, now, ids)
        now += 1000
        assert one_by_one.collect(now) == columns.collect(now), interval
    assert seq.rejected == col.rejected > 0


def test_a_column_at_a_time_overflows_the_same_keys() -> None:
    one_by_one, columns = HistogramGroup(DELTA, "always_on"), HistogramGroup(DELTA, "always_on")
    seq = one_by_one.histogram(BUCKETED, "s", "d", c.DURATION_BUCKETS_S, attributes_of)
    col = columns.histogram(BUCKETED, "s", "d", c.DURATION_BUCKETS_S, attributes_of)
    for k in range(CARDINALITY_LIMIT + 5):
        seq.record(f"p{k}", 0.01 * (k % 7), 5)
        col.record_many(f"p{k}", [0.01 * (k % 7)], 5, [None])
    assert one_by_one.collect(10) == columns.collect(10)
