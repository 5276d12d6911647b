"""Spans from Jaeger through its API v3 (``GET /api/v3/traces``), which answers OTLP JSON.

Jaeger searches by service and time range and returns whole traces wrapped in ``{"result":
...}`` (possibly several such objects in a row), or HTTP 404 when nothing matched. A page that
returns ``search_depth`` traces may be cut, so it is split into two halves of its time range
until pages fit. The run is picked out by the ``traceml.run.id`` attribute of its spans.
"""

from __future__ import annotations

from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.otlp_decode import (
    ForeignDocument,
    resource_spans,
    scope_spans,
    span_field,
    span_id_hex,
    trace_id_hex,
)
from traceml_otel.analyze.sources.base import SourceError
from traceml_otel.analyze.sources.http import HttpSpanSource
from traceml_otel.analyze.sources.otlp_json import MALFORMED, feed_resource_spans
from traceml_otel.analyze.timerange import rfc3339

MIN_WINDOW_S = 0.001
"""The narrowest page: a full page this short is accepted with a warning."""


class JaegerSpanSource(HttpSpanSource):
    """Spans of one service (and run) from Jaeger's ``/api/v3/traces``.

    Args:
        url: Jaeger query's HTTP address, e.g. ``http://127.0.0.1:16686``.
        service: the ``service.name`` to search (required by Jaeger).
        when: the search range; ``page_size``: ``query.search_depth`` (traces per page).
    """

    backend = "Jaeger"

    def feed(self, assembler: StepAssembler) -> None:
        if not self.service:
            raise SourceError("a Jaeger search needs the service name: pass --service")
        seen: set[tuple[str, str]] = set()
        pending = [(self.when.start, self.when.end)]
        while pending:
            start, end = pending.pop()
            resources, traces = self._search(start, end)
            if traces >= self.page_size:
                if end - start > MIN_WINDOW_S:
                    middle = (start + end) / 2
                    pending += [(middle, end), (start, middle)]
                    continue
                self.log.warn(
                    f"Jaeger returned {traces} traces for {MIN_WINDOW_S} s of the run; some may be missing"
                )
            _drop_seen(resources, seen)
            try:
                feed_resource_spans(resources, assembler, service=self.service)
            except MALFORMED as exc:
                self.skipped(exc, "malformed spans")
            self.log.progress(f"Jaeger: {self.pages} pages, {assembler.spans:,} spans")

    def _search(self, start: float, end: float) -> tuple[list[dict], int]:
        """The ``ResourceSpans`` of one page and how many distinct traces they hold."""
        params = {
            "query.service_name": self.service,
            "query.start_time_min": rfc3339(start),
            "query.start_time_max": rfc3339(end),
            "query.search_depth": self.page_size,
        }
        documents = self.get_page("/api/v3/traces", params, missing_ok=True)
        resources: list[dict] = []
        for document in documents:
            try:
                resources += _only_span_objects(resource_spans(document))
            except ForeignDocument as error:
                if isinstance(document, dict) and "error" in document:
                    raise SourceError(f"Jaeger answered an error: {document['error']}") from None
                raise SourceError(f"Jaeger answered something that is not OTLP traces ({error})") from None
        traces = {
            trace_id_hex(span_field(span, "traceId", "trace_id"))
            for resource in resources
            for spans in scope_spans(resource)
            for span in spans
        }
        return resources, len(traces)


def _only_span_objects(resources: list[dict]) -> list[dict]:
    """``resources`` with every span that is not a JSON object (``null``, a number) left out, in place."""
    for resource in resources:
        for spans in scope_spans(resource):
            if not all(isinstance(span, dict) for span in spans):
                spans[:] = [span for span in spans if isinstance(span, dict)]
    return resources


def _drop_seen(resources: list[dict], seen: set[tuple[str, str]]) -> None:
    """Remove spans already read from an earlier page (pages overlap at their edges)."""
    for resource in resources:
        for spans in scope_spans(resource):
            fresh = []
            for span in spans:
                key = (
                    trace_id_hex(span_field(span, "traceId", "trace_id")),
                    span_id_hex(span_field(span, "spanId", "span_id")),
                )
                if key not in seen:
                    seen.add(key)
                    fresh.append(span)
            spans[:] = fresh
