"""Step metrics in the emitter: OTel instruments exported over OTLP, and optionally the same
series served for Prometheus scraping with ``prometheus-client``.

Both paths carry one metric set (docs/telemetry.md): step, phase and input-wait histograms
with exemplars that point at the step's trace, the step counter, the collective histograms and
call and byte counters (per source and kind), CUDA peak memory as the
maximum over each export (or scrape) interval, the dropped-spans counter (0 from the first
export, read live from the span shipper), the run-liveness pair (time of the last step and
the clean-end marker) and the per-rank info series. The step number is never an attribute.

This module is the OTLP path (:class:`StepMetrics`, which also feeds the scrape path);
the shared live state and labels are in emit/live_state.py, the direct scrape path in
emit/prometheus_scrape.py. Their names are re-exported here. The OTLP histograms are not SDK
instruments: emit/histogram_accumulator.py aggregates them (an SDK ``record`` cost ~15 µs of the
emitter's CPU a measurement) and emit/metric_merge.py adds them to what the SDK's reader collects,
so the SDK's exporter still sends them; the counters and gauges are the SDK's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.first_failure import FirstFailureWatch
from traceml_otel.emit.histogram_accumulator import HistogramGroup
from traceml_otel.emit.live_state import (
    NS,
    CollectiveSample,
    IntervalPeak,
    LiveState,
    RankLabels,
    collective_sample,
    phase_seconds,
)
from traceml_otel.emit.metric_export import CountingMetricExporter, MetricExportCounts
from traceml_otel.emit.metric_merge import add_to_collection, histogram_temporality
from traceml_otel.emit.prometheus_scrape import PrometheusEndpoint, PrometheusStepMetrics, serve_registry
from traceml_otel.emit.run_end import exit_of, linger_seconds
from traceml_otel.emit.spans import StepSpans
from traceml_otel.emit.step_protobuf import EncodedStep
from traceml_otel.emit.step_run import RunMeasures, StepRun, exemplar_ids, resolve_records, run_segments
from traceml_otel.settings import launcher_name
from traceml_otel.step_records import StepRecord

__all__ = [
    "SCRAPE_REPLY_GRACE_S", "CollectiveSample", "IntervalPeak", "LiveState", "PrometheusEndpoint",
    "PrometheusStepMetrics", "RankLabels", "StepMetrics", "serve_registry",
]

SCRAPE_REPLY_GRACE_S = 0.5
"""After the linger, how long the endpoint stays up to finish a reply it is still sending."""

_Ids = tuple[int, int] | None
"""A sampled step's (trace id, span id): its measurements' exemplar context; ``None``: not sampled."""
_Column = tuple[list[float], list[_Ids]]
"""One histogram series' values of a batch, in step order, and each one's exemplar context."""


def _make_metric_exporter(protocol: str):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


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
        self._histograms: HistogramGroup | None = None
        self._attributes = {c.ATTR_JOB: labels.job_label, c.ATTR_RUN_ID: labels.run_id,
                            c.ATTR_RANK: labels.rank}
        self.state = LiveState(labels, dropped_spans)
        self._pending_collectives: dict[tuple[str, str], list[int]] = {}
        self._pending_peaks: tuple[int, int] | None = None
        self._allocated = IntervalPeak()
        self._reserved = IntervalPeak()
        self._provider: MeterProvider | None = None
        self._prometheus: PrometheusStepMetrics | None = None
        if prometheus is not None:
            self._prometheus = PrometheusStepMetrics(prometheus, self.state)
        if protocol is None and metric_reader is None:
            return
        try:
            if metric_reader is None:
                protocol = protocol or "grpc"
                self._counted = CountingMetricExporter(
                    _make_metric_exporter(protocol), protocol, metrics_endpoint, on_export_failure)
            reader = metric_reader or PeriodicExportingMetricReader(self._counted)
            meter = self._start_provider(resource, reader)
            self._create_histograms(reader, resource)
            self._create_counters(meter)
            self._register_observers(meter)
            self.state.time.register_otlp(meter, self._attributes)
        except Exception:
            self._stop_after_failed_start()
            raise

    def _stop_after_failed_start(self) -> None:
        """Nothing keeps running when the OTLP side could not start: no export, no endpoint."""
        if self._counted is not None:
            self._counted.give_up("metrics could not start")
        if self._provider is not None:
            self._provider.shutdown(timeout_millis=1000)
        if self._prometheus is not None:
            self._prometheus.close()

    def _start_provider(self, resource: Resource, reader: MetricReader) -> Meter:
        """The meter provider and its meter (the histograms are ours: :meth:`_create_histograms`)."""
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        return self._provider.get_meter(c.INSTRUMENTATION_SCOPE, __version__)

    def _create_histograms(self, reader: MetricReader, resource: Resource) -> None:
        """The step, phase, input-wait and collective duration histograms, aggregated by hand
        (emit/histogram_accumulator.py: the SDK's ``record`` cost ~15 µs a measurement) and added to
        each collection of ``reader`` in our scope, with the reader's histogram temporality;
        c.SUM_ONLY_HISTOGRAMS have no boundary (one bucket), the others c.DURATION_BUCKETS_S."""
        group = self._histograms = HistogramGroup(histogram_temporality(reader))

        def histogram(name: str, description: str, attributes_of: Callable[[Any], dict[str, Any]]):
            boundaries = () if name in c.SUM_ONLY_HISTOGRAMS else c.DURATION_BUCKETS_S
            return group.histogram(name, "s", description, boundaries, attributes_of)

        def rank(_: object) -> dict[str, Any]:
            return dict(self._attributes)

        def phase(name: str) -> dict[str, Any]:
            return {**self._attributes, c.ATTR_PHASE_NAME: name}

        def collective(key: tuple[str, str]) -> dict[str, Any]:
            return {**self._attributes, c.ATTR_COLLECTIVE_SOURCE: key[0], c.ATTR_COLLECTIVE_KIND: key[1]}

        self._step = histogram(c.METRIC_STEP_DURATION, "Traced step time on the step's clock", rank)
        self._phase = histogram(c.METRIC_PHASE_DURATION, "Duration of one phase call", phase)
        self._wait = histogram(c.METRIC_STEP_INPUT_WAIT, "Input wait before each step (measured steps)", rank)
        self._collective = histogram(
            c.METRIC_COLLECTIVE_DURATION,
            "Collective time of one step per (source, kind), overlapping compute or not", collective)
        self._collective_exposed = histogram(
            c.METRIC_COLLECTIVE_EXPOSED,
            "The part of a step's collective time the step waited for, per (source, kind)", collective)
        scope = InstrumentationScope(c.INSTRUMENTATION_SCOPE, __version__)
        add_to_collection(reader, group.collect, resource, scope)

    def _create_counters(self, meter: Meter) -> None:
        """The collective call and byte counters and the step, sample and token counters."""
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

    def _register_observers(self, meter: Meter) -> None:
        """The series read at export time: dropped spans, last input wait, CUDA peaks, liveness,
        exit, rank info and the stalled gauge."""
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
            c.METRIC_RUN_FIRST_FAILURE, [self._observe_first_failure],
            description="Always 1 after the end once the launcher saw a rank fail first; labels name it",
        )
        meter.create_observable_gauge(
            c.METRIC_RANK_INFO, [self._observe_info], description="Always 1; labels describe the rank",
        )
        meter.create_observable_gauge(
            c.METRIC_WORLD_SIZE, [self._observe_world], description="Ranks in the job",
        )
        meter.create_observable_gauge(
            c.METRIC_PROGRESS_STALLED, [self._observe_stalled], unit="s",
            description="Seconds without progress once a hang was seen (0 otherwise), with the phase",
        )

    @property
    def records_steps(self) -> bool:
        """Whether steps recorded here are ever read (an OTLP metric reader or a scrape endpoint)."""
        return self._provider is not None or self._prometheus is not None

    def record_batch(self, steps: Iterable[tuple[StepRecord | None, StepSpans | EncodedStep, bool]]) -> None:
        """Record a batch of (record, spans, exemplar) steps: the histograms a series at a time, the
        counters (steps, samples, tokens, collective calls and bytes) once for the batch: the same
        totals, and each SDK ``add`` costs ~10 µs. A step whose record is ``None`` is read from its
        run's columns (:mod:`traceml_otel.emit.step_run`); the scrape path decodes it."""
        steps = list(steps)
        if not self.records_steps:  # no OTLP metrics and no scrape endpoint: nothing would read them
            self._add_counts(len(steps), [], [])
            return
        if self._prometheus is not None:  # the scrape path reads a record per step
            records = resolve_records([record for record, _, _ in steps], [built for _, built, _ in steps])
            steps = [(record, built, exemplar)
                     for record, (_, built, exemplar) in zip(records, steps, strict=True)]
        samples: list[int] = []
        tokens: list[int] = []
        for run, first, part in run_segments(steps):
            if run is None:
                records = [record for record, _, _ in part]
                self.state.time.account.add_steps(records)
                self._record_steps(part)
                samples += [r.samples for r in records if r.samples is not None]
                tokens += [r.tokens for r in records if r.tokens is not None]
            else:
                stop = first + len(part)
                self.state.time.account.add_run(run, first, stop)
                measures = self._record_run(run, first, stop, exemplar_ids(part))
                samples += [n for n in measures.samples[first:stop] if n is not None]
                tokens += [n for n in measures.tokens[first:stop] if n is not None]
        self._add_counts(len(steps), samples, tokens)

    def record(self, record: StepRecord, spans: StepSpans | EncodedStep, exemplar: bool = True) -> None:
        """Record one step; the step span becomes the exemplar's trace context when ``exemplar``."""
        self.record_batch([(record, spans, exemplar)])

    def _record_run(self, run: StepRun, first: int, stop: int, ids: list[_Ids]) -> RunMeasures:
        """The live state and the OTLP histograms of a run's steps ``first`` to ``stop``, a column at a
        time: what :meth:`_record_steps` records of their records (no scrape path here)."""
        measures, part = run.measures(), slice(first, stop)
        state = self.state
        waits: list[float | None] = measures.waits[part]
        wait_ids = ids
        if None in waits:
            kept = [(wait, pair) for wait, pair in zip(waits, ids, strict=True) if wait is not None]
            waits, wait_ids = [wait for wait, _ in kept], [pair for _, pair in kept]
        if waits:
            state.last_wait_s = waits[-1]
        state.last_step_end_s = measures.end_ns[stop - 1] * NS
        if measures.peaks is not None:
            self._note_peaks((max(measures.peaks[0][part]), max(measures.peaks[1][part])))
        calls: dict[str, list[list[float]]] = {}  # a phase's calls, in call order
        for name, seconds in measures.phases:
            calls.setdefault(name, []).append(seconds[part])
        histograms = self._histograms
        assert histograms is not None
        now_ns = time.time_ns()
        with histograms.lock:
            self._step.record_many(None, measures.step_seconds[part], now_ns, ids)
            for name, columns in calls.items():
                if len(columns) == 1:
                    self._phase.record_many(name, columns[0], now_ns, ids)
                else:  # step by step, call by call, as a step at a time records them
                    self._phase.record_many(name, list(chain.from_iterable(zip(*columns, strict=True))),
                                            now_ns, [pair for pair in ids for _ in columns])
            self._wait.record_many(None, waits, now_ns, wait_ids)
        return measures

    def _record_steps(self, steps: list[tuple[StepRecord, StepSpans | EncodedStep, bool]]) -> None:
        """The live state, the scrape path and the histograms of a batch's steps (the time account is
        fed by the caller; the counters wait for :meth:`_add_counts`). Each histogram series gets its
        values in step order in one :meth:`~.HistogramAccumulator.record_many`."""
        prometheus = self._prometheus
        state = self.state
        histograms = self._histograms if self._provider is not None else None
        ids_column: list[_Ids] = []
        step_values: list[float] = []
        waits: _Column = ([], [])
        phase_columns: dict[str, _Column] = {}
        collective_columns: dict[tuple[Any, tuple[str, str]], _Column] = {}
        for record, spans, exemplar in steps:
            on_gpu = record.gpu_duration_ns is not None
            step_s = (record.gpu_duration_ns if on_gpu else record.traced_cpu_ns) * NS
            ids = (spans.trace_id, spans.span_id) if exemplar else None
            ids_column.append(ids)
            step_values.append(step_s)
            wait_s: float | None = None
            if record.input_wait_ns is not None:
                wait_s = (record.input_wait_gpu_ns if on_gpu and record.input_wait_gpu_ns is not None
                          else record.input_wait_ns) * NS
                waits[0].append(wait_s)
                waits[1].append(ids)
            memory = None
            if record.peak_allocated_bytes is not None and record.peak_reserved_bytes is not None:
                memory = (record.peak_allocated_bytes, record.peak_reserved_bytes)
                self._note_peaks(memory)
            phases = [(p.phase, phase_seconds(p, on_gpu)) for p in record.phases]
            for phase, seconds in phases:
                column = phase_columns.get(phase)
                if column is None:
                    column = phase_columns[phase] = ([], [])
                column[0].append(seconds)
                column[1].append(ids)
            collectives = [collective_sample(span, on_gpu) for span in spans.collectives]
            for one in collectives:
                key = (one.source, one.kind)
                if histograms is not None:  # (no OTLP metrics: the scrape path alone)
                    for histogram, value in ((self._collective, one.seconds),
                                             (self._collective_exposed, one.exposed)):
                        if value is not None:
                            column = collective_columns.setdefault((histogram, key), ([], []))
                            column[0].append(value)
                            column[1].append(ids)
                totals = self._pending_collectives.setdefault(key, [0, 0])
                totals[0] += one.calls
                totals[1] += one.nbytes
            if prometheus is not None:
                prometheus.record(step_s, phases, wait_s, memory, ids)
                prometheus.record_work(record.samples, record.tokens)
                prometheus.record_collectives(collectives)
        if waits[0]:
            state.last_wait_s = waits[0][-1]
        if steps:
            state.last_step_end_s = steps[-1][0].end_ns * NS
        if histograms is None or not steps:
            return
        now_ns = time.time_ns()
        with histograms.lock:
            self._step.record_many(None, step_values, now_ns, ids_column)
            for phase, (values, ids_of) in phase_columns.items():
                self._phase.record_many(phase, values, now_ns, ids_of)
            self._wait.record_many(None, waits[0], now_ns, waits[1])
            for (histogram, key), (values, ids_of) in collective_columns.items():
                histogram.record_many(key, values, now_ns, ids_of)

    def _note_peaks(self, peaks: tuple[int, int]) -> None:
        """Fold (allocated, reserved) CUDA peaks into the batch's maxima (the interval peaks move once a
        batch, in :meth:`_add_counts`)."""
        pending = self._pending_peaks
        self._pending_peaks = peaks if pending is None else (max(pending[0], peaks[0]),
                                                             max(pending[1], peaks[1]))

    def _add_counts(self, steps: int, samples: list[int], tokens: list[int]) -> None:
        """The step, sample, token and pending collective counters, one SDK ``add`` per series, and
        the batch's CUDA peaks into the interval peaks."""
        if self._pending_peaks is not None:
            self._allocated.update(self._pending_peaks[0])
            self._reserved.update(self._pending_peaks[1])
            self._pending_peaks = None
        if self._provider is None or not steps:
            return
        self._steps.add(steps, self._attributes)
        if samples:
            self._samples.add(sum(samples), self._attributes)
        if tokens:
            self._tokens.add(sum(tokens), self._attributes)
        pending, self._pending_collectives = self._pending_collectives, {}
        for (source, kind), (calls, nbytes) in pending.items():
            labels = {**self._attributes, c.ATTR_COLLECTIVE_SOURCE: source, c.ATTR_COLLECTIVE_KIND: kind}
            self._collective_calls.add(calls, labels)
            self._collective_bytes.add(nbytes, labels)

    @property
    def export_counts(self) -> MetricExportCounts | None:
        """OTLP metric export calls delivered and failed so far; ``None`` without OTLP metrics."""
        return self._counted.counts if self._counted is not None else None

    @property
    def values_rejected(self) -> int:
        """Durations the histograms dropped so far as not finite or negative (the SDK's histograms
        drop them too). The OTLP and the scrape path see the same measurements, so one path's count:
        OTLP's when it runs, else the scrape endpoint's."""
        if self._histograms is not None:
            return self._histograms.rejected
        return self._prometheus.rejected if self._prometheus is not None else 0

    def watch_time_record(self, run_dir: Path, rank: int, hang: object | None = None) -> None:
        """Read this rank's ``rank-R.time.json`` in ``run_dir`` for the time counters and MFU, and its
        stalls from ``hang`` (the hang watch's state)."""
        self.state.time.account.path = Path(run_dir) / c.time_file_name(rank)
        watch = FirstFailureWatch(Path(run_dir))
        self.state.first_failure = lambda: watch() if self.state.ended else None
        self.state.first_failure_expected = launcher_name(os.environ) == "traceml run"
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

    def linger(self, minimum_s: float, announce: Callable[[float], None] | None = None) -> float:
        """Keep the scrape endpoint up after the end so every scraper sees the end marker once.

        It stays up ``minimum_s`` after the end, longer when a scraper was seen scraping less often
        (:func:`~traceml_otel.emit.run_end.linger_seconds`), then closes. Not "until the first scrape":
        the other replica of an HA pair scrapes at another moment. ``announce`` is told the seconds
        left before it waits. Returns the seconds it waited.
        """
        if self._prometheus is None:
            return 0.0
        prometheus = self._prometheus
        started = time.monotonic()
        linger_s = linger_seconds(minimum_s, prometheus.scrapes.longest_interval_s)
        if linger_s > 0:  # a bad end is seen once its first failure is read (LiveState.end_for_scrape)
            linger_s += self.state.end_hold_s
        end = (self.state.ended_at or started) + linger_s
        if announce is not None and end - started >= 1.0:
            announce(end - started)
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

    def _observe_world(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._one(self.state.labels.world_size or None)

    def _observe_stalled(self, options: CallbackOptions) -> Iterable[Observation]:
        seconds, phase = self.state.stalled()
        return [Observation(seconds, {**self._attributes, c.ATTR_PHASE_NAME: phase})]

    def _observe_exit(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.state.exit is None:
            return []
        status, reason = self.state.exit
        return [Observation(1, {**self._attributes, c.ATTR_EXIT_STATUS: status, c.ATTR_EXIT_REASON: reason})]

    def _observe_first_failure(self, options: CallbackOptions) -> Iterable[Observation]:
        found = self.state.first_failure()
        if found is None:
            return []
        return [Observation(1, {**self._attributes, c.ATTR_FIRST_FAILURE_RANK: str(found[0]),
                                c.ATTR_FIRST_FAILURE_REASON: found[1]})]

    def _observe_info(self, options: CallbackOptions) -> Iterable[Observation]:
        info = {
            c.ATTR_HOST: self.state.labels.host, c.ATTR_LOCAL_RANK: self.state.labels.local_rank,
            c.ATTR_CUDA_DEVICE: self.state.cuda_device, c.ATTR_GPU_UUID: self.state.gpu_uuid,
            c.ATTR_VERSION: self.state.labels.version,
        }
        return [Observation(1, {**self._attributes, **info})]
