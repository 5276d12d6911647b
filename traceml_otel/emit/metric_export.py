"""Counted OTLP metric export: every export call of the periodic reader succeeds or is counted as failed.

The SDK's ``PeriodicExportingMetricReader`` logs a failed export and moves on; a dead metrics
endpoint would lose every interval's points without a number anywhere. This wrapper sits between
the reader and the SDK's OTLP metric exporter (it exports nothing itself), counts the calls, and
keeps the cause of the last failure in words (:func:`traceml_otel.emit.export_errors.failure_cause`).
The counts go into ``rank-R.export.json`` (``metric_exports``, ``metric_export_failures``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from traceml_otel.emit.export_errors import failure_cause, install_log_recorder


@dataclass(slots=True)
class MetricExportCounts:
    """Export calls so far: delivered, failed, and why the last one failed."""

    exported: int = 0
    failed: int = 0
    last_error: str | None = None
    in_flight: int = 0
    """Calls still running (at shutdown: their points did not arrive before the deadline)."""


class CountingMetricExporter(MetricExporter):
    """Delegates to ``inner`` and counts each export call's outcome; an exception counts as a failure."""

    def __init__(
        self, inner: MetricExporter, protocol: str, endpoint: str | None,
        on_first_failure: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._protocol = protocol
        self._endpoint = endpoint
        self._on_first_failure = on_first_failure
        self._lock = threading.Lock()
        self._counts = MetricExportCounts()
        self._given_up: str | None = None
        self._last_failed = False

    @property
    def counts(self) -> MetricExportCounts:
        """A copy of the counts (read from another thread)."""
        with self._lock:
            counts = self._counts
            return MetricExportCounts(counts.exported, counts.failed, counts.last_error, counts.in_flight)

    def give_up(self, cause: str) -> None:
        """The endpoint is down (``cause``): end a retrying export now, fail later ones at once."""
        with self._lock:
            self._given_up = cause
        try:
            self._inner.shutdown(timeout_millis=0)
        except Exception:  # shutting down a failing exporter must not fail the emitter's exit
            pass

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        if self._given_up is not None:
            with self._lock:
                self._counts.failed += 1
                self._counts.last_error = self._given_up
            return MetricExportResult.FAILURE
        logs = install_log_recorder()
        logs.take()  # forget what earlier calls on this thread logged
        with self._lock:
            self._counts.in_flight += 1
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            error = None if result == MetricExportResult.SUCCESS else failure_cause(
                logs.take(), self._protocol, self._endpoint)
        except Exception as exc:  # the reader would log and drop it; we count it
            result, error = MetricExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._counts.in_flight -= 1
            if error is not None and self._given_up is not None:
                error = self._given_up  # ended by give_up(): the endpoint's cause, not "shutdown"
            self._last_failed = error is not None
            if error is None:
                self._counts.exported += 1
                return result
            first = self._counts.failed == 0
            self._counts.failed += 1
            self._counts.last_error = error
        if first and self._on_first_failure is not None:
            self._on_first_failure(f"OTLP metric export ({self._protocol}) to {self._endpoint} is failing: "
                                   f"{error}; failed exports are counted in rank-R.export.json")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        if self._given_up is None:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    @property
    def failing_cause(self) -> str | None:
        """The last export's failure cause while export is failing (``None`` once one succeeded)."""
        with self._lock:
            return self._counts.last_error if self._counts.failed and self._last_failed else None
