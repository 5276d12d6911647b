"""The emitter's count of spans OTLP did not deliver, kept exact while it moves between owners.

Spans not delivered are counted in three places while the emitter runs: the live span shipper
(failed, queue full, not sent at shutdown), spans the emitter never offered (skipped: behind,
export turned off, not sent at shutdown) and the statistics record, into which both are folded
once. The live ``traceml_export_dropped_spans_total`` series reads the sum from the metrics thread
while the emitter moves counts, so every move happens under one lock: never counted twice, never lost.
The metric side's counts (export calls, measurements the histograms dropped) are copied in too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from traceml_otel.emit.metric_export import MetricExportCounts
from traceml_otel.wire.export_stats import ExportStats

NOT_SENT_AT_SHUTDOWN = "not sent before shutdown deadline"
METRIC_EXPORT_UNFINISHED = "a metric export was still running at the shutdown deadline"


class ShipperCounts(Protocol):
    """What a span shipper counted (:class:`traceml_otel.emit.span_export.ExportCounts`)."""

    exported: int
    sampled_out: int
    budget_dropped: int
    failed: int
    queue_full: int
    not_sent_at_shutdown: int
    last_error: str | None

    @property
    def dropped(self) -> int: ...


class MetricCounts(Protocol):
    """What the step metrics counted (:class:`traceml_otel.emit.step_metrics.StepMetrics`)."""

    @property
    def export_counts(self) -> MetricExportCounts | None: ...

    @property
    def values_rejected(self) -> int: ...


class DropLedger:
    """Skipped spans by reason, and the moves of the shipper's counts into ``stats``."""

    def __init__(self, stats: ExportStats, redact: Callable[[str], str]) -> None:
        self.stats = stats
        self.lock = threading.Lock()
        """Held by every move of a count; the emitter holds it too while it drops its shipper."""
        self._skipped: dict[str, int] = {}
        self._redact = redact

    def skip(self, reason: str, spans: int) -> None:
        """``spans`` were never offered to OTLP, for ``reason``."""
        with self.lock:
            self._skipped[reason] = self._skipped.get(reason, 0) + spans

    def dropped(self, live: Callable[[], int]) -> int:
        """Spans not delivered so far; ``live`` reads the running shipper's own count (0 without one)."""
        with self.lock:
            return self.stats.otlp_dropped + live() + sum(self._skipped.values())

    def take_shipper(self, counts: ShipperCounts, not_sent: str = NOT_SENT_AT_SHUTDOWN) -> None:
        """Fold a retired shipper's counts into the statistics (the caller holds :attr:`lock`)."""
        stats = self.stats
        stats.otlp_exported += counts.exported
        stats.otlp_sampled_out += counts.sampled_out
        stats.otlp_budget_dropped += counts.budget_dropped
        stats.otlp_dropped += counts.dropped
        if counts.last_error:
            stats.otlp_last_error = self._redact(counts.last_error)
        for reason, n in (("export failed", counts.failed), ("queue full", counts.queue_full),
                          (not_sent, counts.not_sent_at_shutdown)):
            if n:
                stats.otlp_drop_reasons[reason] = stats.otlp_drop_reasons.get(reason, 0) + n

    def settle(self) -> None:
        """Fold the skipped spans into the statistics, by reason (at shutdown)."""
        stats = self.stats
        with self.lock:
            for reason, spans in self._skipped.items():
                stats.otlp_drop_reasons[reason] = stats.otlp_drop_reasons.get(reason, 0) + spans
                stats.otlp_dropped += spans
            self._skipped = {}

    def take_rejected(self, metrics: MetricCounts | None) -> bool:
        """Copy the measurements the metric histograms dropped so far; True when the count moved.
        Without ``metrics`` (none, or turned off) the count copied last stays."""
        if metrics is None:
            return False
        rejected = metrics.values_rejected
        moved = rejected != self.stats.metric_values_rejected
        self.stats.metric_values_rejected = rejected
        return moved

    def take_metric_counts(self, metrics: MetricCounts) -> None:
        """Copy the OTLP metric export counts (an export still running at the deadline counts as
        failed) and the rejected measurements."""
        self.take_rejected(metrics)
        counts = metrics.export_counts
        if counts is not None:
            self.stats.metric_exports = counts.exported
            self.stats.metric_export_failures = counts.failed + counts.in_flight
            error = counts.last_error or (METRIC_EXPORT_UNFINISHED if counts.in_flight else None)
            self.stats.metric_last_error = self._redact(error) if error else None
