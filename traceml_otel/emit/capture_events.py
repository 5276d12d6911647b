"""The emitter's side of a deep capture: each capture summary becomes one ``traceml.capture`` span.

The training process's exporter thread writes ``rank-R.capture-N.json`` (``capture/capture_export.py``).
While idle, the emitter looks for the next one (one ``stat`` a second, N counting from 1) and, once it is
there, writes a ``traceml.capture`` span to the local copy and offers it to OTLP: a root span in the
trace of the first captured step, from the profiler's start to its stop, carrying the trigger, the
steps, the trace's file name and the top operator. A trace viewer then shows the capture beside the
steps it covers.

With a scrape endpoint (``TRACEML_PROMETHEUS_PORT``), ``POST /capture`` on it asks this rank for a capture
(:func:`capture_route`). Under the span budget, :class:`CaptureNotices` tells the budget which steps are
around a capture (they are always exported).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_otel import contract as c
from traceml_otel.emit.spans import SpanData
from traceml_otel.wire._json import RecordError, read_json_object
from traceml_otel.wire.bounded_file import FileChange
from traceml_otel.wire.capture_record import (
    MAX_REQUEST_STEPS,
    MAX_SUMMARY_BYTES,
    CaptureRequest,
    CaptureSummary,
    decode_summary,
    demand_file_name,
    read_status,
    status_file_name,
    summary_file_name,
    write_request,
)

if TYPE_CHECKING:
    from traceml_otel.emit.capture_triggers import CaptureTriggers
    from traceml_otel.emit.span_budget import SpanBudget

POLL_S = 1.0


def capture_span(summary: CaptureSummary) -> SpanData:
    """The ``traceml.capture`` span of one capture summary."""
    first = summary.steps[0] if summary.steps else 0
    start_ns = int((summary.started_unix or summary.finished_unix) * 1e9)
    end_ns = max(start_ns, int((summary.stopped_unix or summary.finished_unix) * 1e9))
    top = summary.top_cpu[0] if summary.top_cpu else None
    attributes: dict[str, object] = {
        c.ATTR_RUN_ID: summary.run_id, c.ATTR_RANK: summary.rank, c.ATTR_STEP: first,
        c.ATTR_CAPTURE_INDEX: summary.index, c.ATTR_CAPTURE_REASON: summary.reason,
        c.ATTR_CAPTURE_DETAIL: summary.detail, c.ATTR_CAPTURE_STEPS: list(summary.steps),
        c.ATTR_CAPTURE_TRACE_FILE: summary.trace_file,
    }
    if top is not None:
        attributes[c.ATTR_CAPTURE_TOP_OPERATOR] = top.name + (f" ({top.frame})" if top.frame else "")
    trace_id = c.step_trace_id(summary.run_id, first)
    span_id = (trace_id ^ (0x43415054 << 32) ^ (summary.rank << 8) ^ summary.index) & ((1 << 64) - 1) or 1
    return SpanData(c.SPAN_CAPTURE, trace_id, span_id, None, start_ns, end_ns, attributes)


class CaptureSummaryWatch:
    """Watches for one rank's next capture summary; :meth:`poll` returns a span for each new one."""

    def __init__(self, run_dir: Path, rank: int, poll_s: float = POLL_S) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.poll_s = poll_s
        self.next_index = 1
        self._next = 0.0

    def poll(self, force: bool = False) -> list[SpanData]:
        """Spans of the summaries written since the last poll (at most every ``poll_s`` unless ``force``)."""
        now = time.monotonic()
        if now < self._next and not force:
            return []
        self._next = now + self.poll_s
        spans: list[Any] = []
        while True:
            path = self.run_dir / summary_file_name(self.rank, self.next_index)
            try:
                os.stat(path, follow_symlinks=False)
            except OSError:
                return spans
            self.next_index += 1
            try:
                spans.append(capture_span(decode_summary(read_json_object(path, MAX_SUMMARY_BYTES))))
            except RecordError:
                continue


class CaptureNotices:
    """What the span budget learns of this rank's captures, so that it keeps every step around one:

    - a request this emitter's triggers wrote: a capture may start at its ``at_step``, so steps from
      the one before are kept;
    - the rank's capture status (``rank-R.capture-status.json``, one ``stat`` per export batch) showing
      a new capture started (on demand, or another trigger's): the poller writes it when it takes the
      request, before the capture starts, so the captured steps' rows arrive after it; steps from the
      first one decided then are kept. A refusal of the last request ends the wait;
    - the capture's summary (its ``traceml.capture`` span): the captured steps, and the one after, are
      the last kept.
    """

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.status_path = run_dir / status_file_name(rank)
        self._status = FileChange(self.status_path)
        self._started = 0
        self._fired = 0

    def before_decide(self, budget: SpanBudget, triggers: CaptureTriggers | None, first_step: int) -> None:
        """Tell ``budget`` of captures asked for or started since the last batch (``first_step``: the
        first step of the batch about to be decided)."""
        if triggers is not None and len(triggers.fired) > self._fired:
            for request in triggers.fired[self._fired:]:
                budget.capture_pending((request.at_step if request.at_step is not None else first_step) - 1)
            self._fired = len(triggers.fired)
        if not self._status.changed():
            return
        status = read_status(self.status_path)
        if status is None:
            return
        if status.started > self._started:
            self._started = status.started
            budget.capture_pending(first_step)
        elif status.last_refusal and triggers is not None and triggers.fired \
                and status.last_request == triggers.fired[-1].id:
            budget.capture_refused()

    def summaries(self, budget: SpanBudget, spans: list[SpanData]) -> None:
        """Tell ``budget`` the steps each new capture took (from its ``traceml.capture`` span)."""
        for span in spans:
            steps = span.attributes.get(c.ATTR_CAPTURE_STEPS) if span.name == c.SPAN_CAPTURE else None
            if isinstance(steps, list) and steps and all(type(step) is int for step in steps):
                budget.capture_done(steps)


def capture_route(run_dir: Path, rank: int) -> Callable[[str], tuple[str, str]]:
    """``POST /capture[?steps=N]`` on the rank's scrape endpoint: an on-demand capture of this rank (its
    request file, as a trigger writes it; the rank's limits apply). For an Alertmanager webhook."""
    from urllib.parse import parse_qs

    def handle(query: str) -> tuple[str, str]:
        values = parse_qs(query, max_num_fields=4)
        raw = (values.get("steps") or ["0"])[0]
        steps = int(raw) if raw.isdigit() else -1
        if not 0 <= steps <= MAX_REQUEST_STEPS:
            return "400 Bad Request", json.dumps({"error": f"steps must be 0..{MAX_REQUEST_STEPS}"})
        request = CaptureRequest(id=f"http-r{rank}-{int(time.time() * 1000) % 10**10}", reason="on_demand",
                                 steps=steps, detail="asked for on the metrics port (POST /capture)",
                                 requested_unix=time.time())
        try:
            write_request(run_dir / demand_file_name(rank), request)
        except OSError as error:
            return "503 Service Unavailable", json.dumps({"error": f"{type(error).__name__}"})
        return "202 Accepted", json.dumps({"request": request.id, "rank": rank})

    return handle


def start_capture_watch(run_dir: Path | None, rank: int) -> CaptureSummaryWatch | None:
    """The rank's capture-summary watch, and ``POST /capture`` on its scrape endpoint when captures are on;
    ``None`` without a run folder."""
    if run_dir is None:
        return None
    from traceml_otel.emit.capture_triggers import capture_settings_on
    from traceml_otel.emit.prometheus_scrape import POST_ROUTES

    if capture_settings_on():
        POST_ROUTES["/capture"] = capture_route(run_dir, rank)
    return CaptureSummaryWatch(run_dir, rank)
