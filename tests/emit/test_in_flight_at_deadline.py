"""A batch in flight at the shutdown deadline is counted by its outcome (issue 21): accepted by a slow
collector within the rest of the budget is delivered, not "not sent"; one that never answers is not sent."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from traceml_otel.emit.span_export import MAX_BATCH_SPANS, OtlpSpanShipper

IN_FLIGHT = (MAX_BATCH_SPANS // 6 + 1) * 6
"""The first batch: the steps of 6 spans until it holds at least ``MAX_BATCH_SPANS`` (516 of 512)."""
QUEUED = 84
"""What is offered after it (14 steps), still in the queue at the deadline."""
TOTAL = IN_FLIGHT + QUEUED


class SlowCollector(SpanExporter):
    """Accepts every batch after ``delay_s`` (a collector under load)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.accepted = 0
        self.started = threading.Event()
        self.sender: threading.Thread | None = None
        """The shipper's thread that called export (it ends once it has handled the answer)."""

    def export(self, spans) -> SpanExportResult:
        self.sender = threading.current_thread()
        self.started.set()
        time.sleep(self.delay_s)
        self.accepted += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _shipper(exporter: SpanExporter) -> OtlpSpanShipper:
    shipper = OtlpSpanShipper(exporter, ALWAYS_ON, "http://collector", lambda span: span, protocol="grpc")
    for step in range(TOTAL // 6):  # steps of 6 spans: one batch of IN_FLIGHT in flight, QUEUED queued
        root = SimpleNamespace(trace_id=step + 1, name="traceml.step")
        shipper.offer([root] * 6)
    return shipper


def test_a_batch_accepted_after_the_deadline_is_delivered_not_lost() -> None:
    collector = SlowCollector(delay_s=0.8)
    shipper = _shipper(collector)
    assert collector.started.wait(10)
    counts = shipper.close(0.1, in_flight_grace_s=10.0)
    assert collector.accepted == IN_FLIGHT
    assert counts.exported == IN_FLIGHT and counts.not_sent_at_shutdown == QUEUED  # never left the queue
    assert counts.exported + counts.dropped == TOTAL


def test_a_batch_still_unanswered_after_the_grace_is_not_sent() -> None:
    collector = SlowCollector(delay_s=1.5)
    shipper = _shipper(collector)
    assert collector.started.wait(10)
    counts = shipper.close(0.1, in_flight_grace_s=0.2)
    assert counts.exported == 0 and counts.not_sent_at_shutdown == TOTAL
    assert collector.sender is not None
    collector.sender.join(10)  # the late answer is handled ...
    assert not collector.sender.is_alive() and collector.accepted == IN_FLIGHT  # ... accepted, after all
    assert counts.exported == 0 and counts.not_sent_at_shutdown == TOTAL
