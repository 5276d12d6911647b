"""The emitter process: one per rank, fed step batches through its stdin pipe.

It turns records into spans and appends them to the local copy as soon as they are read;
OTLP export and metrics get the time the pipe leaves free, so a busy machine delays export,
never the local copy. Each output fails alone: a local copy on a full or read-only disk, a
busy Prometheus port or a broken exporter turns off that output only, says so once on stderr
and in ``rank-R.export.json``, and the others go on.

Priority: the work runs on a thread at ``nice 10`` while the trainer trains. When the trainer
shuts down it writes a byte on a second pipe (``--hurry-fd``; its end of stream, when the trainer
dies, counts too); the main thread, still at nice 0, then takes over, so the rest of the local
copy is written at full priority however busy the CPUs are. The process ignores
SIGINT and SIGTERM, so a Ctrl-C or a launcher's SIGTERM reaches the trainer, whose flush
arrives here; it stops at end of stream, which also comes when the trainer is SIGKILLed.

It reports back on its stdout (a pipe the trainer reads at shutdown) one JSON line once the local
copy is closed, so the trainer states completeness from what was written, not from hope.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.export_errors import probe_protocol
from traceml_otel.emit.hang_events import HangRecordWatch
from traceml_otel.emit.local_copy import LocalCopyWriter
from traceml_otel.emit.redact import Redactor, header_secrets, install_log_redaction
from traceml_otel.emit.span_export import (
    OtlpSpanShipper,
    make_span_exporter,
    quiet_sdk_exporter_logs,
    sampler_from_settings,
)
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, StepSpanBuilder, StepSpans
from traceml_otel.emit.step_metrics import PrometheusEndpoint, RankLabels, StepMetrics
from traceml_otel.emit.step_table import StepTable
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.export_stats import ExportStats, encode_export_stats
from traceml_otel.wire.frames import WIRE_VERSION, FrameBuffer, WireError
from traceml_otel.wire.hello import Hello, WireVersionError, decode_hello
from traceml_otel.wire.step_row import decode_step

SPAN_DRAIN_SHARE = 0.8
"""Share of the trainer's ``TRACEML_SHUTDOWN_TIMEOUT_S`` that span export gets at shutdown; metrics'
final export gets the rest."""
PROBE_S = 0.5
"""At shutdown, how long one endpoint gets to show it listens and speaks the protocol."""
DEAD_ENDPOINT_DRAIN_S = 1.0
"""Span drain at shutdown when the last export attempt failed (the endpoint is down), if shorter."""
EMITTER_NICENESS = 10
MAX_EXPORT_BACKLOG_SPANS = 100_000
"""Spans written locally but not yet offered to OTLP; beyond this, export is skipped (counted)."""
EMITTER_BEHIND = "emitter behind (CPU busy); kept in the local copy"
NOT_SENT_AT_SHUTDOWN = "not sent before shutdown deadline"
EXPORT_TURNED_OFF = "OTLP export turned off after an error"
METRIC_EXPORT_UNFINISHED = "a metric export was still running at the shutdown deadline"
_READ_CHUNK = 1 << 20
STATS_RESERVED_BYTES = 8192
STATS_INTERVAL_S = 1.0
"""``rank-R.export.json`` is rewritten at most this often while steps arrive (one 8 KiB write), so a
dead or stopped emitter leaves counts at most this old."""


def build_resource(hello: Hello) -> Resource:
    """Our resource attributes, merged under ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``."""
    attributes: dict[str, Any] = {
        "service.instance.id": f"{hello.run_id}/rank-{hello.rank}",
        "host.name": hello.host,
        "process.pid": hello.pid,
        c.ATTR_RUN_ID: hello.run_id,
        c.ATTR_JOB: hello.job or hello.run_id,
    }
    if hello.service_name:
        attributes["service.name"] = hello.service_name
    # Resource.create merges the env detector (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) under ours;
    # service.name is only ours when the env named none. A provider the program set up wins over both.
    resource = Resource.create(attributes)
    if hello.user_resource:
        resource = resource.merge(Resource({**hello.user_resource, c.ATTR_RUN_ID: hello.run_id}))
    return resource


_REDACT = Redactor(header_secrets())


def _describe(error: BaseException) -> str:
    return _REDACT(f"{type(error).__name__}: {error}")


class Emitter:
    """Spans, local copy, OTLP and metrics for one rank; each output can fail on its own."""

    def __init__(self, hello: Hello) -> None:
        self.anchor_ns = hello.anchor_ns
        rank = RankInfo(
            run_id=hello.run_id, rank=hello.rank, local_rank=hello.local_rank,
            world_size=hello.world_size, node_rank=hello.node_rank, host=hello.host, cpus=hello.cpus,
        )
        resource = build_resource(hello)
        scope = InstrumentationScope(c.INSTRUMENTATION_SCOPE, __version__)
        self.builder = StepSpanBuilder(rank)
        self.stats = ExportStats(run_id=rank.run_id, rank=rank.rank)
        self.drain_s = float(hello.shutdown_timeout_s)
        """The trainer's ``TRACEML_SHUTDOWN_TIMEOUT_S``: all OTLP export at shutdown fits in it."""
        self._export_backlog: deque[tuple[list[StepRecord], list[StepSpans]]] = deque()
        self._export_backlog_spans = 0
        self._export_skipped: dict[str, int] = {}
        self._counts_lock = threading.Lock()
        self._stats_failed = False
        self._stats_written = 0.0
        self._stats_dirty = False
        self.stats_path: Path | None = None
        self.local: LocalCopyWriter | None = None
        self.table: StepTable | None = None
        if hello.run_dir:
            run_dir = Path(hello.run_dir)
            if not run_dir.is_symlink():  # a link planted at the run folder: nothing written through it
                self.stats_path = run_dir / c.export_stats_file_name(rank.rank)
            try:
                self.local = LocalCopyWriter(run_dir / c.traces_file_name(rank.rank), resource, scope)
            except OSError as error:
                self.disable("local copy", f"cannot open it in {run_dir} ({_describe(error)})")
            if self.local is not None:  # the table sits beside the spans it summarizes
                self.table = StepTable(run_dir, rank.run_id, rank.rank, self.warn,
                                       str(resource.attributes.get("service.name", "")))
        quiet_sdk_exporter_logs()
        self.shipper: OtlpSpanShipper | None = None
        if hello.traces_endpoint and hello.traces_protocol:
            endpoint, protocol = hello.traces_endpoint, hello.traces_protocol
            self.stats.otlp_endpoint = endpoint
            try:
                self.shipper = OtlpSpanShipper(
                    make_span_exporter(protocol),
                    sampler_from_settings(hello.sampler, hello.sampler_arg),
                    endpoint,
                    ReadableSpanFactory(resource, scope).convert,
                    on_first_failure=self.warn,
                    protocol=protocol,
                )
            except Exception as error:
                self.disable("OTLP span export", f"the exporter could not start ({_describe(error)})")
        self.metrics: StepMetrics | None = self._start_metrics(hello, resource, rank)
        run_dir = Path(hello.run_dir) if hello.run_dir else None
        self.hang_watch = HangRecordWatch(run_dir, rank.rank, rank.run_id) if run_dir is not None else None
        if self.hang_watch is not None and self.metrics is not None:
            self.metrics.state.stalled = self.hang_watch.state.stalled
        if run_dir is not None and self.metrics is not None:
            self.metrics.watch_time_record(run_dir, rank.rank,
                                           self.hang_watch.state if self.hang_watch is not None else None)
        self.write_stats()

    def _start_metrics(self, hello: Hello, resource: Resource, rank: RankInfo) -> StepMetrics | None:
        protocol = hello.metrics_protocol
        self.metrics_protocol = protocol
        self.stats.metrics_endpoint = hello.metrics_endpoint
        labels = RankLabels(run_id=rank.run_id, rank=rank.rank, local_rank=rank.local_rank, host=rank.host,
                            version=__version__, job=hello.job)
        self.linger_s = float(hello.prometheus_linger_s)
        endpoint = _prometheus_endpoint(hello)
        if endpoint is not None:
            try:
                return StepMetrics(resource, labels, protocol, endpoint, dropped_spans=self._dropped_spans,
                                   metrics_endpoint=self.stats.metrics_endpoint, on_export_failure=self.warn)
            except OSError as error:
                self.disable("Prometheus endpoint", f"cannot serve on {endpoint.address}:{endpoint.port} "
                                                    f"({_describe(error)})")
        try:
            return StepMetrics(resource, labels, protocol, None, dropped_spans=self._dropped_spans,
                               metrics_endpoint=self.stats.metrics_endpoint, on_export_failure=self.warn)
        except Exception as error:
            self.disable("metrics", f"could not start ({_describe(error)})")
            return None

    def _dropped_spans(self) -> int:
        """Spans OTLP has not delivered so far (read by the live dropped-spans series, on its thread)."""
        with self._counts_lock:  # counts move between shipper, skipped and stats: never twice, never lost
            live = self.shipper.counts.dropped if self.shipper is not None else 0
            return self.stats.otlp_dropped + live + sum(self._export_skipped.values())

    def poll_hang(self, force: bool = False) -> None:
        """A new hang in this rank's hang record becomes a ``traceml.hang`` span (local copy and OTLP)."""
        span = self.hang_watch.poll(force) if self.hang_watch is not None else None
        if span is None:
            return
        if self.local is not None:
            try:
                self.local.write([span])
            except OSError as error:
                self._local_failed(error)
        if self.shipper is not None:
            try:
                self.shipper.offer([span])
            except Exception as error:
                self.warn(f"the hang span could not be offered to OTLP ({_describe(error)})")

    def handle_device(self, frame: dict[str, Any]) -> None:
        """The trainer reported its CUDA device (index, UUID) for the info series."""
        if self.metrics is not None:
            uuid = frame.get("uuid")
            self.metrics.set_device(int(frame["index"]), str(uuid)[:128] if uuid else None)

    # --- faults -----------------------------------------------------------------
    def warn(self, message: str) -> None:
        """One ``traceml: rank R: ...`` line on stderr (header values redacted)."""
        print(f"traceml: rank {self.stats.rank}: {_REDACT(message)}", file=sys.stderr, flush=True)

    def disable(self, output: str, reason: str) -> None:
        """Turn one output off: recorded in the statistics and said once; the others go on."""
        if output in self.stats.outputs_disabled:
            return
        self.stats.outputs_disabled[output] = reason
        self.warn(f"{output} turned off: {reason}; training and the other outputs continue")
        self.write_stats()

    # --- steps ------------------------------------------------------------------
    def handle_steps(self, rows: list[Any]) -> None:
        """Build one batch of steps and write it to the local copy; export waits its turn."""
        records = [decode_step(row, self.anchor_ns) for row in rows]
        built = [self.builder.build(record) for record in records]
        self.stats.steps_received += len(records)
        if self.local is not None:
            try:
                self.local.write([span for step in built for span in step.all()], steps=len(records))
            except OSError as error:
                self._local_failed(error)
            self.stats.spans_local = self.local.spans_written if self.local else self.stats.spans_local
            self.stats.steps_local = self.local.steps_written if self.local else self.stats.steps_local
        if self.table is not None:
            self.table.write(built)
        self._stats_dirty = True
        self.refresh_stats()
        spans = sum(len(step.phases) + 1 for step in built)
        if self._export_backlog_spans + spans > MAX_EXPORT_BACKLOG_SPANS:
            self._skip_export(EMITTER_BEHIND, records, built)
            return
        self._export_backlog.append((records, built))
        self._export_backlog_spans += spans

    def refresh_stats(self) -> None:
        """Rewrite the statistics when steps arrived since the last write, at most every
        ``STATS_INTERVAL_S`` (bounded cost; a dead or stopped emitter leaves counts that recent)."""
        if self._stats_dirty and time.monotonic() - self._stats_written >= STATS_INTERVAL_S:
            self.write_stats()

    def _local_failed(self, error: OSError) -> None:
        local, self.local = self.local, None
        assert local is not None
        self.stats.spans_local, self.stats.steps_local = local.spans_written, local.steps_written
        try:
            local.close()
        except OSError:
            pass
        self.disable("local copy", f"writing {local.path} failed after {local.steps_written} steps "
                                   f"({_describe(error)})")

    @property
    def has_export_work(self) -> bool:
        return bool(self._export_backlog)

    def export_next(self) -> None:
        """Offer the oldest written batch to OTLP export and metrics."""
        records, built = self._export_backlog.popleft()
        self._export_backlog_spans -= sum(len(step.phases) + 1 for step in built)
        sampled = [True] * len(built)  # exemplars point only at traces that are sent
        if self.shipper is not None:
            offered = 0
            try:
                for spans in built:
                    sampled[offered] = self.shipper.offer(spans.all())
                    offered += 1
            except Exception as error:
                self._count_skipped(EXPORT_TURNED_OFF, sum(len(s.phases) + 1 for s in built[offered:]))
                self.disable("OTLP span export", f"failed ({_describe(error)})")
                self._stop_shipper()
        elif self.stats.otlp_endpoint is not None:
            self._count_skipped(EXPORT_TURNED_OFF, sum(len(s.phases) + 1 for s in built))
        self._record_metrics(records, built, sampled)

    def _record_metrics(self, records: list[StepRecord], built: list[StepSpans], sampled: list[bool]) -> None:
        if self.metrics is not None:
            try:
                for record, spans, kept in zip(records, built, sampled, strict=False):
                    self.metrics.record(record, spans, exemplar=kept)
            except Exception as error:
                self._take_metric_counts()
                self.metrics = None
                self.disable("metrics", f"recording failed ({_describe(error)})")
        else:
            self.stats.metrics_skipped_steps += len(records)

    def _skip_export(self, reason: str, records: list[StepRecord], built: list[StepSpans]) -> None:
        if self.stats.otlp_endpoint is not None:
            self._count_skipped(reason, sum(len(step.phases) + 1 for step in built))
        self.stats.metrics_skipped_steps += len(records)

    def _count_skipped(self, reason: str, spans: int) -> None:
        with self._counts_lock:
            self._export_skipped[reason] = self._export_skipped.get(reason, 0) + spans

    def _stop_shipper(self) -> None:
        shipper = self.shipper
        if shipper is not None:
            self._retire_shipper(shipper, shipper.close(0.0))

    def _retire_shipper(self, shipper: OtlpSpanShipper, counts: Any,
                        not_sent: str = NOT_SENT_AT_SHUTDOWN) -> None:
        with self._counts_lock:
            self.shipper = None
            self._take_counts(counts, not_sent)

    # --- shutdown ---------------------------------------------------------------
    def finish_local(self, status: str, capture_dropped: int, clean: bool, steps_traced: int | None) -> dict:
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
        local_on = "local copy" not in stats.outputs_disabled and self.stats_path is not None
        if steps_traced is not None and self.stats_path is not None:
            stats.local_copy_complete = local_on and stats.steps_local == steps_traced
        self.write_stats()
        return {"t": "local", "rank": stats.rank, "enabled": local_on, "steps": stats.steps_local,
                "traced": steps_traced, "complete": stats.local_copy_complete,
                "disabled": stats.outputs_disabled}

    def finish_export(self) -> None:
        """Offer what is left to OTLP within the deadline, shut export down, write the final stats.

        All of it fits in ``drain_s`` (the trainer's ``TRACEML_SHUTDOWN_TIMEOUT_S``): spans get the
        first ``SPAN_DRAIN_SHARE`` of it, metrics' final export the rest. An endpoint that is down or
        speaks the other protocol (:func:`probe_protocol`, at most ``PROBE_S`` per endpoint) gets no
        wait at all: what is left is counted as not sent, with that cause.
        """
        started = time.monotonic()
        span_down, metric_down = self._endpoints_down()
        drain_s = self.drain_s * SPAN_DRAIN_SHARE
        if span_down is not None:
            drain_s = 0.0
        elif self.shipper is not None and self.shipper.last_export_failed:
            drain_s = min(drain_s, DEAD_ENDPOINT_DRAIN_S)  # no point waiting on an endpoint that is failing
        deadline = started + drain_s
        not_sent = NOT_SENT_AT_SHUTDOWN if span_down is None else f"not sent: {span_down}"
        while self._export_backlog and time.monotonic() < deadline:
            self.export_next()
        # Recording a step in the metrics is in-memory work: with the span endpoint down, the spans' share
        # of the budget goes to it, so a loaded machine does not lose the last steps from the metrics.
        metrics_until = started + self.drain_s * SPAN_DRAIN_SHARE
        while self._export_backlog:
            records, built = self._export_backlog.popleft()
            if span_down is not None and time.monotonic() < metrics_until:
                # The span endpoint is down, the metrics' may not be: the steps still count in the metrics.
                self._count_skipped(not_sent, sum(len(step.phases) + 1 for step in built))
                self._record_metrics(records, built, [False] * len(built))
            else:
                self._skip_export(not_sent, records, built)
        self._export_backlog_spans = 0
        if self.shipper is not None:
            shipper = self.shipper
            # A batch in flight at the span deadline may still be accepted: it gets the rest of the budget,
            # unless the endpoint is down (then nothing it holds can be delivered).
            grace = 0.0 if span_down is not None else max(
                0.0, started + self.drain_s - max(deadline, time.monotonic()))
            counts = shipper.close(max(0.0, deadline - time.monotonic()), grace)
            if span_down is not None:
                counts.last_error = span_down
            self._retire_shipper(shipper, counts, not_sent)
        if metric_down is not None and self.metrics is not None:
            self.metrics.give_up_export(metric_down)
        stats = self.stats
        with self._counts_lock:
            for reason, spans in self._export_skipped.items():
                stats.otlp_drop_reasons[reason] = stats.otlp_drop_reasons.get(reason, 0) + spans
                stats.otlp_dropped += spans
            self._export_skipped = {}
        if self.metrics is not None:
            try:
                left = max(0.0, started + self.drain_s - time.monotonic())
                # Down: the final export fails at once; only an export already hung in a read is waited for.
                self.metrics.shutdown(timeout_s=min(left, DEAD_ENDPOINT_DRAIN_S) if metric_down else left)
            except Exception as error:
                stats.problems.append(f"metrics shutdown failed ({_describe(error)})")
        self._take_metric_counts()
        if stats.otlp_dropped:
            self.warn(f"{stats.otlp_dropped} span(s) were not delivered over OTLP to {stats.otlp_endpoint} "
                      f"({stats.otlp_drop_reasons}); "
                      + ("the local copy has them" if stats.local_copy_complete else "see the account"))
        stats.final = True
        self.write_stats()
        if stats.clean_shutdown and self.metrics is not None:
            # Every scraper sees the end marker, so the end is not mistaken for a dead rank.
            self.metrics.linger(self.linger_s)

    def finish(self, status: str, capture_dropped: int, clean: bool, steps_traced: int | None = None) -> None:
        """Both shutdown stages at once (tests and benchmarks)."""
        self.finish_local(status, capture_dropped, clean, steps_traced)
        self.finish_export()

    def _take_metric_counts(self) -> None:
        """Copy the OTLP metric export counts (they include the final export at shutdown)."""
        counts = self.metrics.export_counts if self.metrics is not None else None
        if counts is not None:  # an export still running at the deadline did not deliver: counted failed
            self.stats.metric_exports = counts.exported
            self.stats.metric_export_failures = counts.failed + counts.in_flight
            error = counts.last_error or (METRIC_EXPORT_UNFINISHED if counts.in_flight else None)
            self.stats.metric_last_error = _REDACT(error) if error else None

    def _endpoints_down(self) -> tuple[str | None, str | None]:
        """Why OTLP span and metric export cannot work now (``None``: not known to fail)."""
        probed: dict[tuple[str, str], str | None] = {}

        def probe(endpoint: str | None, protocol: str | None) -> str | None:
            if not endpoint or not protocol:
                return None
            if (endpoint, protocol) not in probed:
                probed[endpoint, protocol] = probe_protocol(endpoint, protocol, PROBE_S)
            return probed[endpoint, protocol]

        spans = metrics = None
        if self.shipper is not None:
            spans = probe(self.stats.otlp_endpoint, self.shipper.protocol) or self.shipper.failing_cause()
            if spans is not None and not _endpoint_level(spans):
                spans = None  # failing for another reason (an HTTP status): the short drain applies
        if self.metrics is not None and self.metrics.export_counts is not None:
            metrics = probe(self.stats.metrics_endpoint, self.metrics_protocol)
        return spans, metrics

    def _take_counts(self, counts: Any, not_sent: str = NOT_SENT_AT_SHUTDOWN) -> None:
        stats = self.stats
        stats.otlp_exported += counts.exported
        stats.otlp_sampled_out += counts.sampled_out
        stats.otlp_dropped += counts.dropped
        stats.otlp_last_error = _REDACT(counts.last_error) if counts.last_error else stats.otlp_last_error
        for reason, n in (("export failed", counts.failed), ("queue full", counts.queue_full),
                          (not_sent, counts.not_sent_at_shutdown)):
            if n:
                stats.otlp_drop_reasons[reason] = stats.otlp_drop_reasons.get(reason, 0) + n

    def write_stats(self) -> None:
        """Replace ``rank-R.export.json`` atomically (a new file renamed over it); a failure is said
        once and never stops the emitter.

        Each new file reserves ``STATS_RESERVED_BYTES`` of disk beyond its end without growing
        (``fallocate`` with ``KEEP_SIZE``, Linux), so that when a full disk refuses a new file the
        final counts can still overwrite the old one in place; the file itself holds only its JSON.
        """
        if self.stats_path is None or self._stats_failed:
            return
        self._stats_written, self._stats_dirty = time.monotonic(), False
        text = encode_export_stats(self.stats)
        temporary = self.stats_path.with_suffix(".tmp")
        try:
            _write_new_file(temporary, text.encode(), reserve=STATS_RESERVED_BYTES)
            os.replace(temporary, self.stats_path)
        except OSError as error:
            try:
                temporary.unlink(missing_ok=True)
            except OSError:
                pass
            if not self._overwrite_stats(text):
                self._stats_failed = True
                self.stats.outputs_disabled.setdefault(
                    "export statistics", f"cannot write {self.stats_path} ({_describe(error)})")
                self.warn(f"export statistics turned off: cannot write {self.stats_path} "
                          f"({_describe(error)})")

    def _overwrite_stats(self, text: str) -> bool:
        """Write over the existing file without allocating (a full disk); False when that fails too."""
        assert self.stats_path is not None
        try:
            flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)  # a FIFO there never blocks
            fd = os.open(self.stats_path, flags)
        except OSError:
            return False
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                return False
            data = text.encode()
            if len(data) > max(status.st_size, status.st_blocks * 512):  # only blocks already held
                return False
            if os.pwrite(fd, data, 0) != len(data):
                return False
            os.ftruncate(fd, len(data))
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def _write_new_file(path: Path, data: bytes, reserve: int = 0) -> None:
    """Write ``path`` from scratch, refusing to follow a symbolic link planted there; ``reserve``
    bytes of disk are held beyond its end where the system allows (its size stays ``len(data)``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if reserve > len(data):
            _reserve_beyond_end(fd, reserve)
    finally:
        os.close(fd)


def _reserve_beyond_end(fd: int, length: int) -> bool:
    """``fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, length)``: disk held for later writes, size unchanged."""
    global _fallocate
    if _fallocate is None:
        try:
            import ctypes
            import ctypes.util

            function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).fallocate
            function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            _fallocate = function
        except (OSError, AttributeError):
            _fallocate = False
    return bool(_fallocate) and _fallocate(fd, 1, 0, length) == 0  # 1: FALLOC_FL_KEEP_SIZE


_fallocate: Any = None
"""libc's ``fallocate`` once looked up (``False`` where there is none)."""


def _endpoint_level(cause: str) -> bool:
    """A cause about the endpoint itself (nothing listens, the other protocol, no answer)."""
    return cause.startswith(
        ("connection refused", "wrong protocol", "timeout", "cannot connect", "host name"))


def _prometheus_endpoint(hello: Hello) -> PrometheusEndpoint | None:
    if hello.prometheus_port is None:
        return None
    return PrometheusEndpoint(hello.prometheus_port + hello.local_rank, hello.prometheus_addr or "127.0.0.1")


def _report(message: dict[str, Any]) -> None:
    """One JSON line to the trainer on our stdout (it may be gone; that is fine)."""
    try:
        os.write(1, (json.dumps(message) + "\n").encode())
    except OSError:
        pass


class PipeSession:
    """Reads the trainer's frames; the local copy first, export when the pipe is idle."""

    def __init__(self, fd: int, buffer: FrameBuffer, hello: Hello) -> None:
        self.fd = fd
        self.buffer = buffer
        self.hello = hello
        self.emitter: Emitter | None = None
        self.eof = False
        self.done = False
        self.started = time.monotonic()

    def start(self) -> None:
        if self.emitter is None:
            self.emitter = Emitter(self.hello)

    def run(self, stop: threading.Event | None = None) -> None:
        """Work until the trainer's goodbye or end of stream, or until ``stop`` is set."""
        self.start()
        emitter = self.emitter
        assert emitter is not None
        while not self.done:
            if stop is not None and stop.is_set():
                return
            try:
                frame = self.buffer.next_frame()
            except (WireError, ValueError) as error:
                emitter.stats.problems.append(
                    f"stream from trainer broken after {time.monotonic() - self.started:.1f}s: {error}")
                self._end("stream from trainer broken", 0, False, None)
                return
            if frame is not None:
                self._handle(frame)
                continue
            if self.eof:
                if self.buffer.pending_bytes:
                    emitter.stats.problems.append("stream from trainer ended inside a frame")
                self._end("trainer exited without shutdown (killed?)", 0, False, None)
                return
            idle = not select.select([self.fd], [], [], 0)[0]
            if idle:
                emitter.poll_hang()
            if idle and emitter.has_export_work and (stop is None or not stop.is_set()):
                emitter.export_next()
                continue
            if idle and not select.select([self.fd], [], [], 0.25)[0]:
                emitter.refresh_stats()
                continue
            data = os.read(self.fd, _READ_CHUNK)
            if data:
                self.buffer.feed(data)
            else:
                self.eof = True

    def _handle(self, frame: dict[str, Any]) -> None:
        assert self.emitter is not None
        kind = frame.get("t")
        if kind == "steps":
            self.emitter.handle_steps(frame["s"])
        elif kind == "device":
            self.emitter.handle_device(frame)
        elif kind == "bye":
            traced = frame.get("traced")
            self._end(str(frame.get("status", "ok")), int(frame.get("dropped", 0)), True,
                      None if traced is None else int(traced))

    def _end(self, status: str, dropped: int, clean: bool, traced: int | None) -> None:
        assert self.emitter is not None
        self.emitter.poll_hang(force=True)  # a hang recorded since the last idle poll still gets its span
        _report(self.emitter.finish_local(status, dropped, clean, traced))
        self.emitter.finish_export()
        self.done = True


def nice_this_thread(niceness: int) -> bool:
    """Lower this thread's priority only (Linux: nice is per thread). False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)
                       + niceness)
    except (OSError, AttributeError):
        return False
    return True


def _read_hello(fd: int, buffer: FrameBuffer) -> Hello | None:
    """The first frame, checked (:func:`decode_hello` raises on another version); None at end of stream."""
    while True:
        frame = buffer.next_frame()
        if frame is not None:
            return decode_hello(frame)
        data = os.read(fd, _READ_CHUNK)
        if not data:
            return None
        buffer.feed(data)


def refuse_stream(fd: int, buffer: FrameBuffer, error: WireVersionError) -> None:
    """A trainer of another wire version: say so once, read its frames to the end without using
    them (it never blocks on us), and report how many steps were dropped, for its own account."""
    rank = "?" if error.rank is None else error.rank
    print(f"traceml: rank {rank}: {error}; this rank's steps are dropped (no spans, local copy or "
          f"metrics): install the same traceml-otel for the training script and its emitter",
          file=sys.stderr, flush=True)
    dropped, traced = 0, None
    try:
        while True:
            frame = buffer.next_frame()
            if frame is None:
                data = os.read(fd, _READ_CHUNK)
                if not data:
                    break
                buffer.feed(data)
            elif frame.get("t") == "steps" and isinstance(frame.get("s"), list):
                dropped += len(frame["s"])
            elif frame.get("t") == "bye":
                traced = frame.get("traced") if type(frame.get("traced")) is int else None
                break
    except (WireError, ValueError, OSError):
        pass  # a stream we cannot read further: what was counted is reported
    reason = f"wire version mismatch (trainer {error.sent!r}, emitter {WIRE_VERSION})"
    _report({"t": "local", "rank": error.rank, "enabled": False, "steps": 0, "traced": traced,
             "complete": False, "disabled": {"emitter": reason}, "refused": reason, "dropped": dropped})


def _hurry_fd(argv: list[str]) -> int | None:
    if "--hurry-fd" in argv[:-1]:
        return int(argv[argv.index("--hurry-fd") + 1])
    return None


def main(argv: list[str] | None = None) -> int:
    """Read frames from stdin until the goodbye or end of stream."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    install_log_redaction(_REDACT)  # the SDK logs a malformed OTEL_EXPORTER_OTLP_HEADERS whole
    hurry = threading.Event()
    hurry_fd = _hurry_fd(sys.argv[1:] if argv is None else argv)
    fd = sys.stdin.fileno()
    buffer = FrameBuffer()
    try:
        hello = _read_hello(fd, buffer)
    except WireVersionError as error:
        refuse_stream(fd, buffer, error)
        return 1
    except (WireError, ValueError, OSError):
        hello = None
    if hello is None:
        print("traceml: emitter got no settings; exiting", file=sys.stderr)
        return 1
    session = PipeSession(fd, buffer, hello)

    def niced_work() -> None:
        nice_this_thread(EMITTER_NICENESS)  # threads it starts (OTLP, metrics) inherit it
        _guarded(session, hurry)

    if hurry_fd is None or not sys.platform.startswith("linux"):
        try:
            os.nice(EMITTER_NICENESS)  # no per-thread priority: the whole process yields to training
        except OSError:
            pass
        _guarded(session, None)
        return 0
    worker = threading.Thread(target=niced_work, name="traceml-emitter", daemon=True)
    worker.start()
    while worker.is_alive():
        if select.select([hurry_fd], [], [], 0.5)[0]:  # a byte, or the trainer is gone
            hurry.set()
            break
    worker.join()
    if not session.done:
        _guarded(session, None)  # the trainer is shutting down: finish here, at the trainer's priority
    return 0


def _guarded(session: PipeSession, stop: threading.Event | None) -> None:
    """Run the session; a bug of ours is reported with the counts so far, never a silent death."""
    try:
        session.run(stop)
    except Exception as error:
        session.done = True
        print(f"traceml: emitter failed: {_describe(error)}", file=sys.stderr, flush=True)
        emitter = session.emitter
        if emitter is not None:
            emitter.stats.problems.append(f"emitter failed: {_describe(error)}")
            emitter.stats.end_status = "emitter failed"
            emitter.stats.final = True
            emitter.write_stats()
            _report({"t": "local", "rank": emitter.stats.rank, "enabled": False,
                     "steps": emitter.stats.steps_local, "traced": None, "complete": False,
                     "disabled": {"emitter": _describe(error)}})


if __name__ == "__main__":
    sys.exit(main())
