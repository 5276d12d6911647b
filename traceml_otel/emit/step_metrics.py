"""Step metrics in the emitter: OTel instruments exported over OTLP, and optionally the same
series served for Prometheus scraping with ``prometheus-client``.

Both paths carry one metric set (docs/telemetry.md): step, phase and input-wait histograms
with exemplars that point at the step's trace, the step counter, the collective histograms and
call and byte counters (per source and kind), CUDA peak memory as the
maximum over each export (or scrape) interval, the dropped-spans counter (0 from the first
export, read live from the span shipper), the run-liveness pair (time of the last step and
the clean-end marker) and the per-rank info series. The step number is never an attribute.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.metric_export import CountingMetricExporter, MetricExportCounts
from traceml_otel.emit.run_end import ScrapeLog, exit_of, linger_seconds
from traceml_otel.emit.spans import SpanData, StepSpans, sampled_context
from traceml_otel.emit.time_metrics import LiveTimeAccount, TimeInstruments
from traceml_otel.step_records import PhaseTiming, StepRecord

_NS = 1e-9
SCRAPE_REPLY_GRACE_S = 0.5
"""After the linger, how long the endpoint stays up to finish a reply it is still sending."""


def _make_metric_exporter(protocol: str):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


@dataclass(frozen=True, slots=True)
class RankLabels:
    """What the per-rank info series says about this rank (joins DCGM and node-exporter)."""

    run_id: str
    rank: int
    local_rank: int
    host: str
    version: str
    job: str = ""
    """The job identity across restarts (``traceml_job``); empty: the run id."""

    @property
    def job_label(self) -> str:
        return self.job or self.run_id


class IntervalPeak:
    """The maximum of the values seen since the last read.

    Each reader (the OTLP export, the Prometheus scrape) owns one, so a peak between two
    reads is never missed. With no new value since the last read it repeats the last
    maximum (the gauge does not vanish during a long step); before any value it is None.
    """

    def __init__(self) -> None:
        self._max: int | None = None
        self._last: int | None = None
        self._lock = threading.Lock()

    def update(self, value: int) -> None:
        with self._lock:
            if self._max is None or value > self._max:
                self._max = value

    def take(self) -> int | None:
        with self._lock:
            if self._max is not None:
                self._last, self._max = self._max, None
            return self._last


class LiveState:
    """The values both readers observe: set by the emitter, read at export or scrape time."""

    def __init__(self, labels: RankLabels, dropped_spans: Callable[[], int]) -> None:
        self.labels = labels
        self.dropped_spans = dropped_spans
        self.last_wait_s: float | None = None
        self.last_step_end_s: float | None = None
        self.ended = 0
        self.ended_at: float | None = None
        """Monotonic time of the end (the linger counts from it)."""
        self.exit: tuple[str, str] | None = None
        """(status, reason) once the rank ended and said how (``traceml.run.exit``)."""
        self.cuda_device: str = ""
        self.gpu_uuid: str = ""
        self.stalled: Callable[[], tuple[float, str]] = lambda: (0.0, "none")
        """Seconds without progress and the phase, from the rank's hang record (emit/hang_events.py)."""
        self.time = TimeInstruments(LiveTimeAccount())
        """The time counters and MFU inputs (emit/time_metrics.py)."""

    def info_labels(self) -> dict[str, str]:
        """Label values of the info series (Prometheus names, without run id and rank)."""
        return {
            "traceml_host": self.labels.host,
            "traceml_local_rank": str(self.labels.local_rank),
            "traceml_cuda_device": self.cuda_device,
            "traceml_gpu_uuid": self.gpu_uuid,
            "traceml_version": self.labels.version,
        }


class StepMetrics:
    """Records each step into OTel instruments (and Prometheus, when an endpoint is given)."""

    def __init__(
        self,
        resource: Resource,
        labels: RankLabels,
        protocol: str | None,
        prometheus: PrometheusEndpoint | None = None,
        dropped_spans: Callable[[], int] = lambda: 0,
        metric_reader: MetricReader | None = None,
        metrics_endpoint: str | None = None,
        on_export_failure: Callable[[str], None] | None = None,
    ) -> None:
        """``metric_reader`` replaces the periodic OTLP reader (tests read with an in-memory one).

        The OTLP exporter is wrapped in a :class:`CountingMetricExporter` (``export_counts``);
        ``on_export_failure`` is told once, at the first failed export to ``metrics_endpoint``.
        """
        self._counted: CountingMetricExporter | None = None
        self._attributes = {c.ATTR_JOB: labels.job_label, c.ATTR_RUN_ID: labels.run_id,
                            c.ATTR_RANK: labels.rank}
        self.state = LiveState(labels, dropped_spans)
        self._phase_labels: dict[str, dict[str, Any]] = {}
        self._allocated = IntervalPeak()
        self._reserved = IntervalPeak()
        self._provider: MeterProvider | None = None
        self._prometheus: PrometheusStepMetrics | None = None
        if prometheus is not None:
            self._prometheus = PrometheusStepMetrics(prometheus, self.state)
        if protocol is None and metric_reader is None:
            return
        if metric_reader is None:
            protocol = protocol or "grpc"
            self._counted = CountingMetricExporter(
                _make_metric_exporter(protocol), protocol, metrics_endpoint, on_export_failure)
        reader = metric_reader or PeriodicExportingMetricReader(self._counted)
        sum_only = [View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(boundaries=()))
                    for name in c.SUM_ONLY_HISTOGRAMS]
        self._provider = MeterProvider(resource=resource, metric_readers=[reader], views=sum_only)
        meter = self._provider.get_meter(c.INSTRUMENTATION_SCOPE, __version__)
        buckets = list(c.DURATION_BUCKETS_S)
        self._step = meter.create_histogram(
            c.METRIC_STEP_DURATION, unit="s", description="Traced step time on the step's clock",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._phase = meter.create_histogram(
            c.METRIC_PHASE_DURATION, unit="s", description="Duration of one phase call",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._wait = meter.create_histogram(
            c.METRIC_STEP_INPUT_WAIT, unit="s", description="Input wait before each step (measured steps)",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._collective = meter.create_histogram(
            c.METRIC_COLLECTIVE_DURATION, unit="s",
            description="Collective time of one step per (source, kind), overlapping compute or not",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._collective_exposed = meter.create_histogram(
            c.METRIC_COLLECTIVE_EXPOSED, unit="s",
            description="The part of a step's collective time the step waited for, per (source, kind)",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._collective_calls = meter.create_counter(
            c.METRIC_COLLECTIVE_CALLS, unit="{call}", description="Collective calls, per (source, kind)"
        )
        self._collective_bytes = meter.create_counter(
            c.METRIC_COLLECTIVE_BYTES, unit="By", description="Collective payload bytes, per (source, kind)"
        )
        self._steps = meter.create_counter(c.METRIC_STEPS, unit="{step}", description="Completed steps")
        self._samples = meter.create_counter(
            c.METRIC_SAMPLES, unit="{sample}", description="Samples processed (steps with a known count)"
        )
        self._tokens = meter.create_counter(
            c.METRIC_TOKENS, unit="{token}", description="Tokens processed (steps that declared them)"
        )
        meter.create_observable_counter(
            c.METRIC_SPANS_DROPPED, [self._observe_dropped], unit="{span}",
            description="Spans OTLP export could not deliver",
        )
        meter.create_observable_gauge(
            c.METRIC_INPUT_WAIT, [self._observe_wait], unit="s", description="Input wait of the last step"
        )
        meter.create_observable_gauge(
            c.METRIC_MEM_PEAK_ALLOCATED, [self._observe_allocated], unit="By",
            description="CUDA peak allocated memory, maximum over the export interval",
        )
        meter.create_observable_gauge(
            c.METRIC_MEM_PEAK_RESERVED, [self._observe_reserved], unit="By",
            description="CUDA peak reserved memory, maximum over the export interval",
        )
        meter.create_observable_gauge(
            c.METRIC_LAST_STEP_TIMESTAMP, [self._observe_last_step], unit="s",
            description="Unix time at which the last step ended",
        )
        meter.create_observable_gauge(
            c.METRIC_RUN_ENDED, [self._observe_ended], description="1 once this rank ended cleanly, else 0",
        )
        meter.create_observable_gauge(
            c.METRIC_RUN_EXIT, [self._observe_exit],
            description="Always 1 once the rank ended; labels say how (clean, exception, signal)",
        )
        meter.create_observable_gauge(
            c.METRIC_RANK_INFO, [self._observe_info], description="Always 1; labels describe the rank",
        )
        meter.create_observable_gauge(
            c.METRIC_PROGRESS_STALLED, [self._observe_stalled], unit="s",
            description="Seconds without progress once a hang was seen (0 otherwise), with the phase",
        )
        self.state.time.register_otlp(meter, self._attributes)

    def record_batch(self, steps: Iterable[tuple[StepRecord, StepSpans, bool]]) -> None:
        """Record a batch of (record, spans, exemplar) steps: the histograms per step, the step, sample
        and token counters once for the batch (the same totals; each SDK ``add`` costs ~10 us)."""
        records = []
        for record, spans, exemplar in steps:
            self.record(record, spans, exemplar, count=False)
            records.append(record)
        if self._provider is None or not records:
            return
        self._steps.add(len(records), self._attributes)
        samples = [r.samples for r in records if r.samples is not None]
        if samples:
            self._samples.add(sum(samples), self._attributes)
        tokens = [r.tokens for r in records if r.tokens is not None]
        if tokens:
            self._tokens.add(sum(tokens), self._attributes)

    def record(self, record: StepRecord, spans: StepSpans, exemplar: bool = True, count: bool = True) -> None:
        """Record one step; the step span becomes the exemplar's trace context when ``exemplar``.
        ``count`` False leaves the step, sample and token counters to :meth:`record_batch`."""
        if self._provider is None and self._prometheus is None:
            return  # no OTLP metrics and no scrape endpoint: nothing would ever read it
        self.state.time.account.add_step(record)
        on_gpu = record.gpu_duration_ns is not None
        step_s = (record.gpu_duration_ns if on_gpu else record.end_ns - record.start_ns) * _NS
        wait_s: float | None = None
        if record.input_wait_ns is not None:
            wait_s = (record.input_wait_gpu_ns if on_gpu and record.input_wait_gpu_ns is not None
                      else record.input_wait_ns) * _NS
            self.state.last_wait_s = wait_s
        self.state.last_step_end_s = record.end_ns * _NS
        memory = None
        if record.peak_allocated_bytes is not None and record.peak_reserved_bytes is not None:
            memory = (record.peak_allocated_bytes, record.peak_reserved_bytes)
            self._allocated.update(memory[0])
            self._reserved.update(memory[1])
        phases = [(p.phase, _phase_seconds(p, on_gpu)) for p in record.phases]
        collectives = [_collective_sample(span, on_gpu) for span in spans.collectives]
        step = spans.step
        if self._prometheus is not None:
            ids = (f"{step.trace_id:032x}", f"{step.span_id:016x}") if exemplar else None
            self._prometheus.record(step_s, phases, wait_s, memory, ids)
            self._prometheus.record_work(record.samples, record.tokens)
            self._prometheus.record_collectives(collectives)
        if self._provider is None:
            return
        context = None
        if exemplar:
            span = NonRecordingSpan(sampled_context(step.trace_id, step.span_id))
            context = trace.set_span_in_context(span)
        self._step.record(step_s, self._attributes, context=context)
        for phase, seconds in phases:
            labels = self._phase_labels.get(phase)
            if labels is None:
                labels = {**self._attributes, c.ATTR_PHASE_NAME: phase}
                if len(self._phase_labels) < 64:
                    self._phase_labels[phase] = labels
            self._phase.record(seconds, labels, context=context)
        if wait_s is not None:
            self._wait.record(wait_s, self._attributes, context=context)
        for one in collectives:
            labels = {**self._attributes, c.ATTR_COLLECTIVE_SOURCE: one.source,
                      c.ATTR_COLLECTIVE_KIND: one.kind}
            if one.seconds is not None:
                self._collective.record(one.seconds, labels, context=context)
            if one.exposed is not None:
                self._collective_exposed.record(one.exposed, labels, context=context)
            self._collective_calls.add(one.calls, labels)
            self._collective_bytes.add(one.nbytes, labels)
        if not count:
            return
        self._steps.add(1, self._attributes)
        if record.samples is not None:
            self._samples.add(record.samples, self._attributes)
        if record.tokens is not None:
            self._tokens.add(record.tokens, self._attributes)

    @property
    def export_counts(self) -> MetricExportCounts | None:
        """OTLP metric export calls delivered and failed so far; ``None`` without OTLP metrics."""
        return self._counted.counts if self._counted is not None else None

    def watch_time_record(self, run_dir: Path, rank: int, hang: object | None = None) -> None:
        """Read this rank's ``rank-R.time.json`` in ``run_dir`` for the time counters and MFU, and its
        stalls from ``hang`` (the hang watch's state)."""
        self.state.time.account.path = Path(run_dir) / c.time_file_name(rank)
        self.state.time.account.hang = hang

    def set_device(self, index: int, uuid: str | None) -> None:
        """The CUDA device this rank uses (from the trainer, once CUDA is initialised)."""
        self.state.cuda_device = str(index)
        self.state.gpu_uuid = uuid or ""

    def mark_ended(self, status: str = "ok") -> None:
        """The rank ended and said goodbye with ``status`` (``ok``, ``exception X``, ``SIGTERM``): the
        next export (the final one) and scrapes carry the end marker and the exit status."""
        self.state.exit = exit_of(status)
        self.state.time.account.end()
        self.state.ended_at = time.monotonic()
        self.state.ended = 1

    def give_up_export(self, cause: str) -> None:
        """The OTLP metrics endpoint is down (``cause``): no retries; the final export fails at once."""
        if self._counted is not None:
            self._counted.give_up(cause)

    @property
    def export_failing(self) -> str | None:
        """Why OTLP metric export is failing now, if it is."""
        return self._counted.failing_cause if self._counted is not None else None

    def shutdown(self, timeout_s: float) -> None:
        """Final OTLP export (it carries the end marker and the final drop count)."""
        if self._provider is not None:
            self._provider.shutdown(timeout_millis=timeout_s * 1000)

    def linger(self, minimum_s: float) -> float:
        """Keep the scrape endpoint up after the end so every scraper sees the end marker once.

        It stays up ``minimum_s`` after the end, longer when a scraper was seen scraping less often
        (:func:`~traceml_otel.emit.run_end.linger_seconds`), then closes. Not "until the first scrape":
        the other replica of an HA pair scrapes at another moment. Returns the seconds it waited.
        """
        if self._prometheus is None:
            return 0.0
        prometheus = self._prometheus
        started = time.monotonic()
        linger_s = linger_seconds(minimum_s, prometheus.scrapes.longest_interval_s)
        end = (self.state.ended_at or started) + linger_s
        while linger_s > 0 and time.monotonic() < end:
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
        if time.monotonic() - prometheus.scrapes.latest < SCRAPE_REPLY_GRACE_S:
            time.sleep(SCRAPE_REPLY_GRACE_S)  # a scrape is still being answered
        prometheus.close()
        return time.monotonic() - started

    def _one(self, value: float | int | None) -> list[Observation]:
        return [] if value is None else [Observation(value, self._attributes)]

    def _observe_wait(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self.state.last_wait_s)

    def _observe_allocated(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self._allocated.take())

    def _observe_reserved(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self._reserved.take())

    def _observe_dropped(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self.state.dropped_spans())

    def _observe_last_step(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self.state.last_step_end_s)

    def _observe_ended(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self.state.ended)

    def _observe_stalled(self, options: CallbackOptions) -> Iterable[Observation]:
        seconds, phase = self.state.stalled()
        return [Observation(seconds, {**self._attributes, c.ATTR_PHASE_NAME: phase})]

    def _observe_exit(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.state.exit is None:
            return []
        status, reason = self.state.exit
        return [Observation(1, {**self._attributes, c.ATTR_EXIT_STATUS: status, c.ATTR_EXIT_REASON: reason})]

    def _observe_info(self, options: CallbackOptions) -> Iterable[Observation]:
        info = {
            c.ATTR_HOST: self.state.labels.host, c.ATTR_LOCAL_RANK: self.state.labels.local_rank,
            c.ATTR_CUDA_DEVICE: self.state.cuda_device, c.ATTR_GPU_UUID: self.state.gpu_uuid,
            c.ATTR_VERSION: self.state.labels.version,
        }
        return [Observation(1, {**self._attributes, **info})]


def _phase_seconds(phase: PhaseTiming, on_gpu: bool) -> float:
    if on_gpu and phase.gpu_duration_ns is not None:
        return phase.gpu_duration_ns * _NS
    return (phase.end_ns - phase.start_ns) * _NS


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One step's collectives of one (source, kind), as the metrics record them."""

    source: str
    kind: str
    seconds: float | None
    """Total time on the step's clock; ``None``: not measured."""
    exposed: float | None
    """The part the step waited for; ``None``: not measured."""
    calls: int = 0
    nbytes: int = 0


def _collective_sample(span: SpanData, on_gpu: bool) -> CollectiveSample:
    a = span.attributes
    return CollectiveSample(
        str(a[c.ATTR_COLLECTIVE_SOURCE]), str(a[c.ATTR_COLLECTIVE_KIND]),
        a.get(c.ATTR_COLLECTIVE_GPU if on_gpu else c.ATTR_COLLECTIVE_CPU),  # type: ignore[arg-type]
        a.get(c.ATTR_COLLECTIVE_EXPOSED_GPU if on_gpu else c.ATTR_COLLECTIVE_EXPOSED_CPU),  # type: ignore[arg-type]
        int(a.get(c.ATTR_COLLECTIVE_CALLS, 0)), int(a.get(c.ATTR_COLLECTIVE_BYTES, 0)),  # type: ignore[arg-type]
    )


@dataclass(frozen=True, slots=True)
class PrometheusEndpoint:
    """Where the direct scrape endpoint listens."""

    port: int
    address: str = "127.0.0.1"


class PrometheusStepMetrics:
    """The same series for direct Prometheus scraping (no collector needed).

    Served in OpenMetrics (with exemplars) to scrapers that ask for it, else in the text
    format. Series appear with their first measurement: nothing is exposed as 0 before it
    was measured, and CUDA memory never on a CPU run. The dropped-spans counter, the
    end marker and the info series are there from the first scrape.
    """

    def __init__(self, endpoint: PrometheusEndpoint | None, state: LiveState) -> None:
        """``endpoint`` None builds the registry without serving it (the scale benchmark reads it)."""
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

        # Nothing reads the OpenMetrics `_created` series (one per counter and histogram series):
        # they would add ~10 series per rank. The emitter is its own process, so this global is ours.
        prometheus_client.disable_created_metrics()
        self.registry = registry = CollectorRegistry()
        labels = ["traceml_job", "traceml_run_id", "traceml_rank"]
        self._labels = {"traceml_job": state.labels.job_label, "traceml_run_id": state.labels.run_id,
                        "traceml_rank": str(state.labels.rank)}
        self._state = state
        self._allocated = IntervalPeak()
        self._reserved = IntervalPeak()
        self._scrapes = 0
        self._scraped = threading.Condition()
        self.scrapes = ScrapeLog()
        buckets = list(c.DURATION_BUCKETS_S)
        self._step = Histogram("traceml_step_duration_seconds", "Traced step time", labels,
                               buckets=buckets, registry=registry)
        # c.SUM_ONLY_HISTOGRAMS: only _sum and _count are read, so a summary without quantiles
        # (prometheus-client's needs two buckets for a histogram; OTLP sends one +Inf bucket).
        self._phase = Summary("traceml_phase_duration_seconds", "Phase call duration",
                              [*labels, "traceml_phase_name"], registry=registry)
        self._wait = Summary("traceml_step_input_wait_seconds", "Input wait before each step", labels,
                             registry=registry)
        collective_labels = [*labels, "traceml_collective_source", "traceml_collective_kind"]
        self._collective = Summary("traceml_collective_duration_seconds", "Collective time per step",
                                   collective_labels, registry=registry)
        self._collective_exposed = Summary(
            "traceml_collective_exposed_seconds", "Exposed collective time per step", collective_labels,
            registry=registry,
        )
        self._collective_calls = Counter("traceml_collective_calls", "Collective calls", collective_labels,
                                         registry=registry)
        self._collective_bytes = Counter("traceml_collective_bytes", "Collective payload bytes",
                                         collective_labels, registry=registry)
        self._steps = Counter("traceml_steps", "Completed steps", labels, registry=registry)
        self._samples = Counter("traceml_samples", "Samples processed", labels, registry=registry)
        self._tokens = Counter("traceml_tokens", "Tokens processed", labels, registry=registry)
        registry.register(_LiveCollector(self))
        self.server = None
        if endpoint is not None:
            self.server = serve_registry(registry, endpoint, self.scrapes)

    def record(
        self, step_s: float, phases: list[tuple[str, float]], wait_s: float | None,
        memory: tuple[int, int] | None, exemplar_ids: tuple[str, str] | None = None,
    ) -> None:
        labels = self._labels
        exemplar = None if exemplar_ids is None else {"trace_id": exemplar_ids[0], "span_id": exemplar_ids[1]}
        self._step.labels(**labels).observe(step_s, exemplar=exemplar)
        for phase, seconds in phases:
            self._phase.labels(**labels, traceml_phase_name=phase).observe(seconds)
        if wait_s is not None:
            self._wait.labels(**labels).observe(wait_s)
        self._steps.labels(**labels).inc()
        if memory is not None:
            self._allocated.update(memory[0])
            self._reserved.update(memory[1])

    def record_work(self, samples: int | None, tokens: int | None) -> None:
        """Count a step's samples and tokens (the series appear with the first known count)."""
        if samples is not None:
            self._samples.labels(**self._labels).inc(samples)
        if tokens is not None:
            self._tokens.labels(**self._labels).inc(tokens)

    def record_collectives(self, collectives: list[CollectiveSample]) -> None:
        """One step's collectives, per (source, kind): total and exposed time when measured, calls, bytes."""
        for one in collectives:
            labels = {**self._labels, "traceml_collective_source": one.source,
                      "traceml_collective_kind": one.kind}
            if one.seconds is not None:
                self._collective.labels(**labels).observe(one.seconds)
            if one.exposed is not None:
                self._collective_exposed.labels(**labels).observe(one.exposed)
            self._collective_calls.labels(**labels).inc(one.calls)
            self._collective_bytes.labels(**labels).inc(one.nbytes)

    def collect_live(self) -> Iterator[object]:
        """The families read at scrape time (called by the registry on each scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state, keys, values = self._state, list(self._labels), list(self._labels.values())

        def gauge(name: str, documentation: str, value: float | int | None, unit: str = "") -> None:
            if value is not None:
                family = GaugeMetricFamily(name, documentation, labels=keys, unit=unit)
                family.add_metric(values, value)
                families.append(family)

        families: list[object] = []
        dropped = CounterMetricFamily("traceml_export_dropped_spans", "Spans OTLP export could not deliver",
                                      labels=keys)
        dropped.add_metric(values, state.dropped_spans())
        families.append(dropped)
        gauge("traceml_input_wait_duration_seconds", "Input wait of the last step", state.last_wait_s)
        gauge("traceml_cuda_memory_peak_allocated_bytes", "CUDA peak allocated, max since the last scrape",
              self._allocated.take())
        gauge("traceml_cuda_memory_peak_reserved_bytes", "CUDA peak reserved, max since the last scrape",
              self._reserved.take())
        gauge("traceml_step_last_timestamp_seconds", "Unix time at which the last step ended",
              state.last_step_end_s)
        gauge("traceml_run_ended", "1 once this rank ended and said so, else 0", state.ended)
        seconds, phase = state.stalled()
        stalled = GaugeMetricFamily("traceml_progress_stalled_seconds",
                                    "Seconds without progress once a hang was seen (0 otherwise)",
                                    labels=[*keys, "traceml_phase_name"])
        stalled.add_metric([*values, phase], seconds)
        families.append(stalled)
        families += state.time.prometheus_families(keys, values)
        if state.exit is not None:
            end = GaugeMetricFamily("traceml_run_exit", "Always 1 once the rank ended; labels say how",
                                    labels=[*keys, "traceml_exit_status", "traceml_exit_reason"])
            end.add_metric([*values, *state.exit], 1)
            families.append(end)
        info_labels = state.info_labels()
        info = GaugeMetricFamily("traceml_rank_info", "Always 1; labels describe the rank",
                                 labels=[*keys, *info_labels])
        info.add_metric([*values, *info_labels.values()], 1)
        families.append(info)
        with self._scraped:
            self._scrapes += 1
            self._scraped.notify_all()
        return iter(families)

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Block until one more scrape happened (or ``timeout_s``); True if it did."""
        with self._scraped:
            seen = self._scrapes
            return self._scraped.wait_for(lambda: self._scrapes > seen, timeout=max(0.0, timeout_s))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _LiveCollector:
    """Adapter: prometheus_client calls ``collect()`` on every scrape."""

    def __init__(self, owner: PrometheusStepMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[object]:
        return self._owner.collect_live()

    def describe(self) -> list[object]:
        return []  # no up-front description: collect() must not run (or count) at registration


def serve_registry(registry: object, endpoint: PrometheusEndpoint, scrapes: ScrapeLog) -> Any:
    """Serve ``registry`` with prometheus-client's WSGI app on a daemon thread, noting each scrape's
    address in ``scrapes`` (how often each scraper comes decides the linger at the end)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

    app = make_wsgi_app(registry)  # type: ignore[arg-type]

    def noting(environ: dict[str, Any], start_response: Any) -> Any:
        scrapes.scraped(str(environ.get("REMOTE_ADDR", "")))
        return app(environ, start_response)

    server_class = ThreadingWSGIServer
    if ":" in endpoint.address:
        server_class = type("ThreadingWSGIServer6", (ThreadingWSGIServer,),
                            {"address_family": socket.AF_INET6})
    server = make_server(endpoint.address, endpoint.port, noting, server_class, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="traceml-scrape").start()
    return server
