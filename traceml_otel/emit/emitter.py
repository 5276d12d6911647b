"""One rank's outputs in the emitter process: spans, the local copy, OTLP export and metrics.

Records become spans and go to the local copy as soon as they are read; OTLP export and metrics
get the time the pipe leaves free (:mod:`traceml_otel.emit.pipe_session` decides when), so a busy
machine delays export, never the local copy. Each output fails alone: a local copy on a full or
read-only disk, a busy Prometheus port or a broken exporter turns off that output only, says so
once on stderr and in ``rank-R.export.json``, and the others go on.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.capture_events import CaptureNotices, start_capture_watch
from traceml_otel.emit.capture_triggers import start_capture_triggers
from traceml_otel.emit.drop_ledger import NOT_SENT_AT_SHUTDOWN, DropLedger, ShipperCounts
from traceml_otel.emit.export_shutdown import (  # noqa: F401 (the shutdown's constants, re-exported)
    DEAD_ENDPOINT_DRAIN_S,
    PROBE_S,
    REDACT,
    SPAN_DRAIN_SHARE,
    ExportShutdown,
    describe,
    span_count,
)
from traceml_otel.emit.hang_events import HangRecordWatch
from traceml_otel.emit.live_summary import start_live_window
from traceml_otel.emit.local_copy import LocalCopyWriter
from traceml_otel.emit.otlp_encode import EncodedSpans, SpanEncoder
from traceml_otel.emit.resource import build_resource
from traceml_otel.emit.run_end import linger_line
from traceml_otel.emit.span_budget import (
    AUTO_MIN_RANKS,
    SPANS_ALL,
    SPANS_AUTO,
    BudgetSettings,
    KeptEncoder,
    SpanBudget,
)
from traceml_otel.emit.span_export import (
    OtlpSpanShipper,
    make_span_exporter,
    quiet_sdk_exporter_logs,
    sampler_from_settings,
)
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder, StepSpans
from traceml_otel.emit.stats_file import StatsFile
from traceml_otel.emit.step_lines import EncodedSteps, StepLines
from traceml_otel.emit.step_metrics import PrometheusEndpoint, RankLabels, StepMetrics
from traceml_otel.emit.step_protobuf import EncodedStep, fill_kept
from traceml_otel.emit.step_run import resolve_records
from traceml_otel.emit.step_table import StepTable
from traceml_otel.emit.trainer_cpu import TrainerCpuSampler
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.control import DeviceInfo, LocalReport
from traceml_otel.wire.export_stats import ExportStats
from traceml_otel.wire.hello import Hello

MAX_EXPORT_BACKLOG_SPANS = 100_000
"""Spans written locally but not yet offered to OTLP; beyond this, export is skipped (counted)."""
EMITTER_BEHIND = "emitter behind (CPU busy); kept in the local copy"
EXPORT_TURNED_OFF = "OTLP export turned off after an error"



class Emitter(ExportShutdown):
    """Spans, local copy, OTLP and metrics for one rank; each output can fail on its own."""

    def __init__(self, hello: Hello) -> None:
        self.anchor_ns = hello.anchor_ns
        self.local_rank = hello.local_rank
        rank = RankInfo(
            run_id=hello.run_id, rank=hello.rank, local_rank=hello.local_rank,
            world_size=hello.world_size, node_rank=hello.node_rank, host=hello.host, cpus=hello.cpus,
        )
        resource = build_resource(hello)
        scope = InstrumentationScope(c.INSTRUMENTATION_SCOPE, __version__)
        self.builder = StepSpanBuilder(rank)
        self.lines = StepLines(self.builder)
        """The local copy's and the step table's text, by templates; it builds span objects only when
        OTLP export or metrics need them."""
        self.stats = ExportStats(run_id=rank.run_id, rank=rank.rank)
        self.ledger = DropLedger(self.stats, REDACT)
        self.metrics: StepMetrics | None = None
        self.drain_s = float(hello.shutdown_timeout_s)
        """The trainer's ``TRACEML_SHUTDOWN_TIMEOUT_S``: all OTLP export at shutdown fits in it."""
        self._export_backlog: deque[tuple[list[StepRecord | None], list[StepSpans | EncodedStep]]] = deque()
        self._export_backlog_spans = 0
        run_dir = Path(hello.run_dir) if hello.run_dir else None
        stats_path = None  # a link planted at the run folder: nothing written through it
        if run_dir is not None and not run_dir.is_symlink():
            stats_path = run_dir / c.export_stats_file_name(rank.rank)
        self.stats_file = StatsFile(stats_path, self._stats_failed)
        self.local: LocalCopyWriter | None = None
        self.table: StepTable | None = None
        if run_dir is not None:
            try:
                self.local = LocalCopyWriter(run_dir / c.traces_file_name(rank.rank), resource, scope)
            except OSError as error:
                self.disable("local copy", f"cannot open it in {run_dir} ({describe(error)})")
            if self.local is not None:  # the table sits beside the spans it summarizes
                self.table = StepTable(run_dir, rank.run_id, rank.rank, self.warn,
                                       str(resource.attributes.get("service.name", "")))
        quiet_sdk_exporter_logs()
        self.shipper: OtlpSpanShipper | None = None
        self.budget: SpanBudget | None = None
        """Which steps' spans OTLP export sends (None: every step; ``TRACEML_OTLP_SPANS=all``)."""
        if hello.traces_endpoint and hello.traces_protocol:
            self.shipper = self._start_shipper(hello, resource, scope)
            if self.shipper is not None and hello.otlp_spans != SPANS_ALL and not (
                    hello.otlp_spans == SPANS_AUTO and rank.world_size < AUTO_MIN_RANKS):
                self.budget = SpanBudget(BudgetSettings(hello.otlp_spans, hello.otlp_sample_rate,
                                                        hello.otlp_span_budget), rank.world_size)
                self.lines.defer_protobuf = True  # the steps the budget drops are never encoded
        self.metrics = self._start_metrics(hello, resource, rank)
        self.hang_watch = HangRecordWatch(run_dir, rank.rank, rank.run_id) if run_dir is not None else None
        if self.hang_watch is not None and self.metrics is not None:
            self.metrics.state.stalled = self.hang_watch.state.stalled
        if run_dir is not None and self.metrics is not None:
            self.metrics.watch_time_record(run_dir, rank.rank,
                                           self.hang_watch.state if self.hang_watch is not None else None)
        self.live = start_live_window(self, run_dir, hello) if stats_path is not None else None
        self.capture_triggers = start_capture_triggers(run_dir if stats_path else None, hello, self.warn)
        self.capture_watch = start_capture_watch(run_dir if stats_path else None, rank.rank)
        self.cpu = (TrainerCpuSampler(run_dir, rank.rank, rank.run_id, hello.pid, self.warn)
                    if stats_path is not None and hello.pid > 0 else None)
        """The training thread's CPU samples for ``compare`` (``rank-R.cpu.json``), read from here."""
        self.capture_notices = (CaptureNotices(run_dir, rank.rank)
                                if self.budget and stats_path and run_dir is not None else None)
        """The budget keeps every step around a capture (emit/capture_events.py)."""
        self.write_stats()

    @property
    def stats_path(self) -> Path | None:
        """``rank-R.export.json`` (None: no run folder)."""
        return self.stats_file.path

    def _start_shipper(self, hello: Hello, resource: Resource, scope: InstrumentationScope,
                       ) -> OtlpSpanShipper | None:
        endpoint, protocol = hello.traces_endpoint, hello.traces_protocol
        assert endpoint is not None and protocol is not None
        self.stats.otlp_endpoint = endpoint
        encoder = SpanEncoder(resource, scope)  # OTLP protobuf straight from our spans (the SDK sends it)
        self.lines.otlp = encoder  # templated steps' spans come encoded (emit/step_protobuf.py)
        try:
            return OtlpSpanShipper(
                make_span_exporter(protocol),
                sampler_from_settings(hello.sampler, hello.sampler_arg),
                endpoint,
                encoder.encode,
                on_first_failure=self.warn,
                protocol=protocol,
                batch=lambda spans: EncodedSpans(encoder, spans),
                convert_kept=KeptEncoder(encoder),
            )
        except Exception as error:
            self.lines.otlp = None
            self.disable("OTLP span export", f"the exporter could not start ({describe(error)})")
            return None

    def _start_metrics(self, hello: Hello, resource: Resource, rank: RankInfo) -> StepMetrics | None:
        protocol = hello.metrics_protocol
        self.metrics_protocol = protocol
        self.stats.metrics_endpoint = hello.metrics_endpoint
        labels = RankLabels(run_id=rank.run_id, rank=rank.rank, local_rank=rank.local_rank, host=rank.host,
                            version=__version__, job=hello.job, world_size=rank.world_size)
        self.linger_s = float(hello.prometheus_linger_s)
        endpoint = _prometheus_endpoint(hello)
        if endpoint is not None:
            try:
                return StepMetrics(resource, labels, protocol, endpoint, dropped_spans=self._dropped_spans,
                                   metrics_endpoint=self.stats.metrics_endpoint, on_export_failure=self.warn)
            except OSError as error:
                self.disable("Prometheus endpoint", f"cannot serve on {endpoint.address}:{endpoint.port} "
                                                    f"({describe(error)})")
            except Exception as error:  # e.g. an SDK without the seam emit/metric_merge.py uses
                self.disable("metrics", f"could not start ({describe(error)})")
                return None
        try:
            return StepMetrics(resource, labels, protocol, None, dropped_spans=self._dropped_spans,
                               metrics_endpoint=self.stats.metrics_endpoint, on_export_failure=self.warn)
        except Exception as error:
            self.disable("metrics", f"could not start ({describe(error)})")
            return None

    def _dropped_spans(self) -> int:
        """Spans OTLP has not delivered so far (read by the live dropped-spans series, on its thread)."""
        return self.ledger.dropped(lambda: self.shipper.counts.dropped if self.shipper is not None else 0)

    def poll_hang(self, force: bool = False) -> None:
        """A new hang in this rank's hang record becomes a ``traceml.hang`` span (local copy and OTLP);
        so does each new capture summary, a ``traceml.capture`` span (``emit/capture_events.py``)."""
        span = self.hang_watch.poll(force) if self.hang_watch is not None else None
        spans = [span] if span is not None else []
        if self.capture_watch is not None:
            spans += self.capture_watch.poll(force)
            if self.capture_notices is not None and self.budget is not None:
                self.capture_notices.summaries(self.budget, spans)
        if not spans:
            return
        if self.local is not None:
            try:
                self.local.write(spans)
            except OSError as error:
                self._local_failed(error)
            self._count_local()  # now: a capture's span often comes after the last step's batch
            self.stats_file.mark_dirty()
        if self.shipper is not None:
            try:
                self.shipper.offer(spans)
            except Exception as error:
                self.warn(f"a hang or capture span could not be offered to OTLP ({describe(error)})")

    def handle_device(self, device: DeviceInfo) -> None:
        """The trainer reported its CUDA device (index, UUID) for the info series."""
        if self.metrics is not None:
            self.metrics.set_device(device.index, device.uuid)

    def _announce_linger(self, seconds: float) -> None:
        """Say once per node (local rank 0) that the run is held open for the last scrape."""
        print(f"traceml: {linger_line(seconds)}", file=sys.stderr, flush=True)

    # --- faults -----------------------------------------------------------------
    def warn(self, message: str) -> None:
        """One ``traceml: rank R: ...`` line on stderr (header values redacted)."""
        print(f"traceml: rank {self.stats.rank}: {REDACT(message)}", file=sys.stderr, flush=True)

    def disable(self, output: str, reason: str) -> None:
        """Turn one output off: recorded in the statistics and said once; the others go on."""
        if output in self.stats.outputs_disabled:
            return
        self.stats.outputs_disabled[output] = reason
        self.warn(f"{output} turned off: {reason}; training and the other outputs continue")
        self.write_stats()

    def _stats_failed(self, reason: str) -> None:
        self.stats.outputs_disabled.setdefault("export statistics", REDACT(reason))
        self.warn(f"export statistics turned off: {reason}")

    # --- steps ------------------------------------------------------------------
    def handle_steps(self, rows: list[Any]) -> None:
        """Write one batch of steps to the local copy and the step table; export waits its turn."""
        self.stats.steps_received += len(rows)
        if self.cpu is not None:
            self.cpu.steps(rows)
        if self.capture_triggers is not None:  # deep captures' triggers (docs/captures.md)
            self.capture_triggers.observe(rows)
        if self.live is not None:
            self.live.count_blocks(rows)
        if self._local_outputs_only:
            if self.metrics is None:
                self.stats.metrics_skipped_steps += len(rows)
            if self.local is None and self.table is None:
                self.stats_file.mark_dirty()
                return
            self._write_local(self.lines.encode(rows, self.anchor_ns))
            return
        encoded = self.lines.encode(rows, self.anchor_ns, keep_spans=True)  # the spans export sends
        self._write_local(encoded)
        records, built = encoded.records, encoded.built
        spans = span_count(built)
        if self._export_backlog_spans + spans > MAX_EXPORT_BACKLOG_SPANS:
            self._skip_export(EMITTER_BEHIND, records, built)
            return
        self._export_backlog.append((records, built))
        self._export_backlog_spans += spans

    @property
    def _local_outputs_only(self) -> bool:
        """No OTLP span export and no metrics: the local copy and the step table are the only outputs
        (the default), so steps need no span objects (:mod:`traceml_otel.emit.step_lines`)."""
        return self.shipper is None and self.stats.otlp_endpoint is None and (
            self.metrics is None or not self.metrics.records_steps)

    def _write_local(self, encoded: EncodedSteps) -> None:
        """A batch to the local copy and the step table (each failure turns that output off)."""
        if self.local is not None:
            try:
                self.local.write_encoded(encoded.spans_json, encoded.spans, encoded.steps)
            except OSError as error:
                self._local_failed(error)
            self._count_local()
        if self.table is not None:
            self.table.write_lines(encoded.rows, encoded.steps)
        if self.live is not None:
            self.live.add(encoded.rows, encoded.steps)
        self.stats_file.mark_dirty()
        self.refresh_stats()

    def refresh_stats(self) -> None:
        """Rewrite the statistics when steps arrived since the last write, at most every
        ``STATS_INTERVAL_S`` (bounded cost; a dead or stopped emitter leaves counts that recent)."""
        if self.ledger.take_rejected(self.metrics):
            self.stats_file.mark_dirty()
        self.stats_file.refresh(self.stats)
        if self.live is not None:
            self.live.maybe_publish()

    def write_stats(self) -> None:
        """Replace ``rank-R.export.json`` now (:class:`~traceml_otel.emit.stats_file.StatsFile`)."""
        self.ledger.take_rejected(self.metrics)
        self.stats_file.write(self.stats)

    def _count_local(self) -> None:
        """Copy the local copy's counts into the statistics (after a failure, the last ones stay)."""
        local = self.local
        if local is not None:
            self.stats.spans_local, self.stats.steps_local = local.spans_written, local.steps_written

    def _local_failed(self, error: OSError) -> None:
        self._count_local()
        local, self.local = self.local, None
        assert local is not None
        try:
            local.close()
        except OSError:
            pass
        self.disable("local copy", f"writing {local.path} failed after {local.steps_written} steps "
                                   f"({describe(error)})")

    @property
    def has_export_work(self) -> bool:
        return bool(self._export_backlog)

    def export_next(self) -> None:
        """Offer the oldest written batch to OTLP export and metrics."""
        records, built = self._export_backlog.popleft()
        self._export_backlog_spans -= span_count(built)
        sampled = [True] * len(built)  # exemplars point only at traces that are sent
        if self.shipper is not None:
            try:
                steps = [spans if isinstance(spans, EncodedStep) else spans.all() for spans in built]
                decisions = None
                if self.budget is not None:  # a decision per step, before any span is encoded
                    decoded = resolve_records(records, built)  # (the budget's steps are decoded already)
                    if self.capture_notices is not None and decoded:  # steps around captures are kept
                        self.capture_notices.before_decide(self.budget, self.capture_triggers,
                                                           decoded[0].step)
                    decisions = self.budget.decide(decoded, [spans.trace_id for spans in built],
                                                   [len(spans) for spans in steps])
                    if self.budget.lowest_probability < 1.0:  # else every step went: nothing to say
                        self.stats.otlp_sample_probability = self.budget.lowest_probability
                    fill_kept(steps, decisions)
                sampled = self.shipper.offer_steps(steps, decisions)
            except Exception as error:  # nothing of the batch was counted: all of it is skipped
                self.ledger.skip(EXPORT_TURNED_OFF, span_count(built))
                self.disable("OTLP span export", f"failed ({describe(error)})")
                self._stop_shipper()
        elif self.stats.otlp_endpoint is not None:
            self.ledger.skip(EXPORT_TURNED_OFF, span_count(built))
        self._record_metrics(records, built, sampled)

    def _record_metrics(self, records: list[StepRecord | None], built: list[StepSpans | EncodedStep],
                        sampled: list[bool]) -> None:
        if self.metrics is not None:
            try:
                self.metrics.record_batch(zip(records, built, sampled, strict=False))
            except Exception as error:
                self.ledger.take_metric_counts(self.metrics)
                self.metrics = None
                self.disable("metrics", f"recording failed ({describe(error)})")
        else:
            self.stats.metrics_skipped_steps += len(records)

    def _skip_export(self, reason: str, records: list[StepRecord | None],
                     built: list[StepSpans | EncodedStep]) -> None:
        if self.stats.otlp_endpoint is not None:
            self.ledger.skip(reason, span_count(built))
        self.stats.metrics_skipped_steps += len(records)

    def _stop_shipper(self) -> None:
        shipper = self.shipper
        if shipper is not None:
            self._retire_shipper(shipper, shipper.close(0.0))

    def _retire_shipper(self, shipper: OtlpSpanShipper, counts: ShipperCounts,
                        not_sent: str = NOT_SENT_AT_SHUTDOWN) -> None:
        self.lines.otlp = None  # no more protobuf for templated steps
        with self.ledger.lock:
            self.shipper = None
            self.ledger.take_shipper(counts, not_sent)

    # --- shutdown ---------------------------------------------------------------
    def finish_local(self, status: str, capture_dropped: int, clean: bool,
                     steps_traced: int | None) -> LocalReport:
        """Close the local copy and say what it holds (the trainer is waiting for this)."""
        stats = self.stats
        stats.capture_dropped_steps = capture_dropped
        stats.clean_shutdown = clean
        stats.end_status = status
        stats.steps_traced = steps_traced
        if clean and self.metrics is not None:
            self.metrics.mark_ended(status)  # the final export and scrapes carry the end and its status
        if self.local is not None:
            try:
                self.local.close()
            except OSError as error:
                self._local_failed(error)
        if self.table is not None:
            self.table.close()
        stats.local_copy_closed_unix = time.time()
        if self.live is not None:
            self.live.publish(ended=True, end_status=status)
        local_on = "local copy" not in stats.outputs_disabled and self.stats_path is not None
        if steps_traced is not None and self.stats_path is not None:
            stats.local_copy_complete = local_on and stats.steps_local == steps_traced
        self.write_stats()
        return LocalReport(rank=stats.rank, enabled=local_on, steps=stats.steps_local, traced=steps_traced,
                           complete=stats.local_copy_complete, disabled=dict(stats.outputs_disabled))

    def finish(self, status: str, capture_dropped: int, clean: bool, steps_traced: int | None = None) -> None:
        """Both shutdown stages at once (tests and benchmarks)."""
        self.finish_local(status, capture_dropped, clean, steps_traced)
        self.finish_export()


def _prometheus_endpoint(hello: Hello) -> PrometheusEndpoint | None:
    if hello.prometheus_port is None:
        return None
    return PrometheusEndpoint(hello.prometheus_port + hello.local_rank, hello.prometheus_addr or "127.0.0.1")

