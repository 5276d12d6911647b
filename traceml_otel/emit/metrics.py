"""Step metrics in the emitter: OTel instruments exported over OTLP, and optionally the same
series served for Prometheus scraping with ``prometheus-client``.

Histograms get explicit second-based boundaries and exemplars that point at the step's
trace. The step number is never an attribute.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan

from traceml_otel import contract as c
from traceml_otel.emit.spans import StepSpans, sampled_context
from traceml_otel.records import PhaseTiming, StepRecord

_NS = 1e-9


def _make_metric_exporter(protocol: str):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


class StepMetrics:
    """Records each step into OTel instruments (and Prometheus, when a port is given)."""

    def __init__(
        self, resource: Resource, run_id: str, rank: int, protocol: str | None, prometheus_port: int | None
    ) -> None:
        self._attributes = {c.ATTR_RUN_ID: run_id, c.ATTR_RANK: rank}
        self._last_wait: float | None = None
        self._last_memory: tuple[int, int] | None = None
        self._provider: MeterProvider | None = None
        self._prometheus: PrometheusStepMetrics | None = None
        if prometheus_port is not None:
            self._prometheus = PrometheusStepMetrics(prometheus_port, run_id, rank)
        if protocol is None:
            return
        reader = PeriodicExportingMetricReader(_make_metric_exporter(protocol))
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self._provider.get_meter(c.INSTRUMENTATION_SCOPE)
        buckets = list(c.DURATION_BUCKETS_S)
        self._step = meter.create_histogram(
            c.METRIC_STEP_DURATION, unit="s", description="Traced step time on the step's clock",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._phase = meter.create_histogram(
            c.METRIC_PHASE_DURATION, unit="s", description="Duration of one phase call",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self._steps = meter.create_counter(c.METRIC_STEPS, unit="{step}", description="Completed steps")
        self.dropped_spans = meter.create_counter(
            c.METRIC_SPANS_DROPPED, unit="{span}", description="Spans OTLP export could not deliver"
        )
        meter.create_observable_gauge(
            c.METRIC_INPUT_WAIT, [self._observe_wait], unit="s", description="Input wait of the last step"
        )
        meter.create_observable_gauge(
            c.METRIC_MEM_PEAK_ALLOCATED, [self._observe_allocated], unit="By",
            description="CUDA peak allocated memory of the last step",
        )
        meter.create_observable_gauge(
            c.METRIC_MEM_PEAK_RESERVED, [self._observe_reserved], unit="By",
            description="CUDA peak reserved memory of the last step",
        )

    def record(self, record: StepRecord, spans: StepSpans) -> None:
        """Record one step; the step span becomes the exemplar's trace context."""
        on_gpu = record.gpu_duration_ns is not None
        step_s = (record.gpu_duration_ns if on_gpu else record.end_ns - record.start_ns) * _NS
        if record.input_wait_ns is not None:
            self._last_wait = (record.input_wait_gpu_ns if on_gpu and record.input_wait_gpu_ns is not None
                               else record.input_wait_ns) * _NS
        if record.peak_allocated_bytes is not None and record.peak_reserved_bytes is not None:
            self._last_memory = (record.peak_allocated_bytes, record.peak_reserved_bytes)
        phases = [(p.phase, _phase_seconds(p, on_gpu)) for p in record.phases]
        if self._prometheus is not None:
            self._prometheus.record(step_s, phases, self._last_wait, self._last_memory)
        if self._provider is None:
            return
        step = spans.step
        context = trace.set_span_in_context(NonRecordingSpan(sampled_context(step.trace_id, step.span_id)))
        self._step.record(step_s, self._attributes, context=context)
        for phase, seconds in phases:
            self._phase.record(seconds, {**self._attributes, c.ATTR_PHASE_NAME: phase}, context=context)
        self._steps.add(1, self._attributes)

    def count_dropped(self, spans: int) -> None:
        if self._provider is not None and spans:
            self.dropped_spans.add(spans, self._attributes)

    def shutdown(self, timeout_s: float) -> None:
        if self._provider is not None:
            self._provider.shutdown(timeout_millis=timeout_s * 1000)

    def _observe_wait(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self._last_wait is None else [Observation(self._last_wait, self._attributes)]

    def _observe_allocated(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self._last_memory is None else [Observation(self._last_memory[0], self._attributes)]

    def _observe_reserved(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self._last_memory is None else [Observation(self._last_memory[1], self._attributes)]


def _phase_seconds(phase: PhaseTiming, on_gpu: bool) -> float:
    if on_gpu and phase.gpu_duration_ns is not None:
        return phase.gpu_duration_ns * _NS
    return (phase.end_ns - phase.start_ns) * _NS


class PrometheusStepMetrics:
    """The same series for direct Prometheus scraping on 127.0.0.1 (no collector needed).

    Series appear with their first measurement: nothing is exposed as 0 before it was measured,
    and CUDA memory never on a CPU run.
    """

    def __init__(self, port: int, run_id: str, rank: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        registry = CollectorRegistry()
        labels = ["traceml_run_id", "traceml_rank"]
        self._labels = {"traceml_run_id": run_id, "traceml_rank": str(rank)}
        buckets = list(c.DURATION_BUCKETS_S)
        self._step = Histogram("traceml_step_duration_seconds", "Traced step time", labels,
                               buckets=buckets, registry=registry)
        self._phase = Histogram("traceml_phase_duration_seconds", "Phase call duration",
                                [*labels, "traceml_phase_name"], buckets=buckets, registry=registry)
        self._steps = Counter("traceml_steps", "Completed steps", labels, registry=registry)
        self._wait = Gauge("traceml_input_wait_duration_seconds", "Input wait of the last step", labels,
                           registry=registry)
        self._allocated = Gauge("traceml_cuda_memory_peak_allocated_bytes", "CUDA peak allocated", labels,
                                registry=registry)
        self._reserved = Gauge("traceml_cuda_memory_peak_reserved_bytes", "CUDA peak reserved", labels,
                               registry=registry)
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def record(
        self, step_s: float, phases: list[tuple[str, float]], wait_s: float | None,
        memory: tuple[int, int] | None,
    ) -> None:
        labels = self._labels
        self._step.labels(**labels).observe(step_s)
        for phase, seconds in phases:
            self._phase.labels(**labels, traceml_phase_name=phase).observe(seconds)
        self._steps.labels(**labels).inc()
        if wait_s is not None:
            self._wait.labels(**labels).set(wait_s)
        if memory is not None:
            self._allocated.labels(**labels).set(memory[0])
            self._reserved.labels(**labels).set(memory[1])
