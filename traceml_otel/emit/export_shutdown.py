"""The emitter's OTLP shutdown: what is left goes out within the trainer's deadline, or is counted.

:class:`ExportShutdown` is the part of :class:`~traceml_otel.emit.emitter.Emitter` that runs once the
local copy is closed: the export backlog is offered until the span deadline, an endpoint that is down
or speaks the other protocol gets no wait (its cause is the not-sent reason), the span shipper and the
metrics shut down in what is left, and the final statistics are written.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from traceml_otel.emit.drop_ledger import NOT_SENT_AT_SHUTDOWN, DropLedger
from traceml_otel.emit.export_errors import endpoint_level, probe_protocol
from traceml_otel.emit.redact import Redactor, header_secrets
from traceml_otel.emit.span_export import OtlpSpanShipper
from traceml_otel.emit.spans import StepSpans
from traceml_otel.emit.step_metrics import StepMetrics
from traceml_otel.emit.step_protobuf import EncodedStep
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.export_stats import ExportStats

SPAN_DRAIN_SHARE = 0.8
"""Share of the trainer's ``TRACEML_SHUTDOWN_TIMEOUT_S`` that span export gets at shutdown; metrics'
final export gets the rest."""
PROBE_S = 0.5
"""At shutdown, how long one endpoint gets to show it listens and speaks the protocol."""
DEAD_ENDPOINT_DRAIN_S = 1.0
"""Span drain at shutdown when the last export attempt failed (the endpoint is down), if shorter."""

REDACT = Redactor(header_secrets())
"""Header values (tokens) never reach stderr or the statistics."""


def describe(error: BaseException) -> str:
    """An error in one line, header values redacted."""
    return REDACT(f"{type(error).__name__}: {error}")


def span_count(built: list[StepSpans | EncodedStep]) -> int:
    """Spans in a batch of built steps."""
    return sum([step.count for step in built])


class ExportShutdown:
    """The emitter's shutdown of OTLP export (a part of :class:`~traceml_otel.emit.emitter.Emitter`)."""

    stats: ExportStats
    ledger: DropLedger
    metrics: StepMetrics | None
    shipper: OtlpSpanShipper | None
    metrics_protocol: str | None
    drain_s: float
    linger_s: float
    local_rank: int
    _export_backlog: deque[tuple[list[StepRecord | None], list[StepSpans | EncodedStep]]]
    _export_backlog_spans: int
    export_next: Callable[[], None]
    warn: Callable[[str], None]
    write_stats: Callable[[], None]
    _announce_linger: Callable[[float], None]
    _record_metrics: Callable[[list[StepRecord | None], list[StepSpans | EncodedStep], list[bool]], None]
    _skip_export: Callable[[str, list[StepRecord | None], list[StepSpans | EncodedStep]], None]
    _retire_shipper: Callable[..., None]

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
        self._drain_backlog(deadline, started + self.drain_s * SPAN_DRAIN_SHARE, span_down, not_sent)
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
        self.ledger.settle()
        self._finish_metrics(max(0.0, started + self.drain_s - time.monotonic()), metric_down)
        stats = self.stats
        if stats.otlp_dropped:
            self.warn(f"{stats.otlp_dropped} span(s) were not delivered over OTLP to {stats.otlp_endpoint} "
                      f"({stats.otlp_drop_reasons}); "
                      + ("the local copy has them" if stats.local_copy_complete else "see the account"))
        stats.final = True
        self.write_stats()
        if stats.clean_shutdown and self.metrics is not None:
            # Every scraper sees the end marker, so the end is not mistaken for a dead rank.
            self.metrics.linger(self.linger_s, self._announce_linger if self.local_rank == 0 else None)

    def _drain_backlog(self, deadline: float, metrics_until: float, span_down: str | None,
                       not_sent: str) -> None:
        """Offer the export backlog until ``deadline``; count the rest as ``not_sent``."""
        while self._export_backlog and time.monotonic() < deadline:
            self.export_next()
        # Recording a step in the metrics is in-memory work: with the span endpoint down, the spans' share
        # of the budget goes to it, so a loaded machine does not lose the last steps from the metrics.
        while self._export_backlog:
            records, built = self._export_backlog.popleft()
            if span_down is not None and time.monotonic() < metrics_until:
                # The span endpoint is down, the metrics' may not be: the steps still count in the metrics.
                self.ledger.skip(not_sent, span_count(built))
                self._record_metrics(records, built, [False] * len(built))
            else:
                self._skip_export(not_sent, records, built)
        self._export_backlog_spans = 0

    def _finish_metrics(self, left_s: float, metric_down: str | None) -> None:
        if self.metrics is not None:
            try:
                # Down: the final export fails at once; only an export already hung in a read is waited for.
                self.metrics.shutdown(timeout_s=min(left_s, DEAD_ENDPOINT_DRAIN_S) if metric_down else left_s)
            except Exception as error:
                self.stats.problems.append(f"metrics shutdown failed ({describe(error)})")
            self.ledger.take_metric_counts(self.metrics)

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
            if spans is not None and not endpoint_level(spans):
                spans = None  # failing for another reason (an HTTP status): the short drain applies
        if self.metrics is not None and self.metrics.export_counts is not None:
            metrics = probe(self.stats.metrics_endpoint, self.metrics_protocol)
        return spans, metrics
