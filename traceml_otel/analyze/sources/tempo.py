"""Spans from Grafana Tempo through TraceQL search with ``select()``.

One query asks for every span of the run, with the attributes the analyzer reads selected, so no
whole trace is fetched: ``{ span.traceml.run.id = "RUN" } | select(span.traceml.rank, ...)``.
Tempo answers "the first N traces found", unordered. A page that comes back full is split into
two halves of its time range until pages fit (a one-second page that still overflows is asked
again with a bigger limit). A span set cut at ``spss`` spans is asked again per half of the ranks.
Spans seen twice (pages overlap at their edges) are counted once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from traceml_otel import contract as c
from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.otlp_decode import as_int, decode_attributes, span_id_hex, trace_id_hex
from traceml_otel.analyze.sources.base import ReadLog, SourceError
from traceml_otel.analyze.sources.http import HttpSpanSource, ReadLimits
from traceml_otel.analyze.sources.otlp_json import MALFORMED
from traceml_otel.analyze.span_schema import WANTED_ATTRIBUTES
from traceml_otel.analyze.timerange import TimeRange

MAX_LIMIT = 20_000
"""The largest page (traces) asked for when a one-second window overflows."""
SELECTED = sorted(WANTED_ATTRIBUTES - {c.ATTR_RUN_ID})


def traceql_string(value: str) -> str:
    """A TraceQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class TempoSpanSource(HttpSpanSource):
    """Spans of one run from Tempo's ``/api/search``.

    Args:
        url: Tempo's HTTP address, e.g. ``http://127.0.0.1:3200``.
        run_id: the run to read (required: it is the search filter).
        when: the search range (Tempo searches by trace start).
        page_size: traces asked per page (``limit``); ``spans_per_set``: Tempo's ``spss``.
    """

    backend = "Tempo"

    def __init__(self, url: str, *, run_id: str | None, when: TimeRange, service: str | None = None,
                 page_size: int = 500, spans_per_set: int = 100, timeout: float = 30.0,
                 log: ReadLog | None = None, limits: ReadLimits | None = None) -> None:
        super().__init__(url, run_id=run_id, when=when, service=service, page_size=page_size,
                         timeout=timeout, log=log, limits=limits)
        self.spans_per_set = spans_per_set

    def query(self, ranks: tuple[int, int] | None = None) -> str:
        """The TraceQL query for this run, optionally limited to ranks ``[low, high)``."""
        conditions = [f"span.{c.ATTR_RUN_ID} = {traceql_string(self.run_id or '')}"]
        if self.service:
            conditions.append(f"resource.service.name = {traceql_string(self.service)}")
        if ranks is not None:
            conditions.append(f"span.{c.ATTR_RANK} >= {ranks[0]} && span.{c.ATTR_RANK} < {ranks[1]}")
        selected = ", ".join(["status"] + [f"span.{name}" for name in SELECTED])
        return "{ " + " && ".join(conditions) + " } | select(" + selected + ")"

    def feed(self, assembler: StepAssembler) -> None:
        if not self.run_id:
            raise SourceError("a Tempo search needs the run id: pass --run-id")
        seen: set[tuple[str, str]] = set()
        pending: list[tuple[int, int, tuple[int, int] | None, int]] = [
            (math.floor(self.when.start), math.ceil(self.when.end), None, self.page_size)
        ]
        while pending:
            start, end, ranks, limit = pending.pop()
            traces = self._search(start, end, ranks, limit)
            if len(traces) >= limit:
                if end - start > 1:
                    middle = (start + end) // 2
                    pending += [(middle, end, ranks, limit), (start, middle, ranks, limit)]
                    continue
                if limit < MAX_LIMIT:
                    pending.append((start, end, ranks, min(MAX_LIMIT, limit * 4)))
                    continue
                self.log.warn(
                    f"Tempo returned {limit} traces for one second of the run; some steps may be missing"
                )
            try:
                split = self._rank_split(traces, ranks)
            except MALFORMED as exc:
                self.skipped(exc)
                split = None
            if split is not None:
                pending += [(start, end, half, limit) for half in split]
                continue
            for span in _spans(traces, self.skipped):
                key = (span["traceId"], span["spanId"])
                if key in seen:
                    continue
                seen.add(key)
                try:
                    assembler.add_span(
                        span.get("name"),
                        decode_attributes(span["attributes"], WANTED_ATTRIBUTES),
                        span,
                        self.run_id,
                    )
                except MALFORMED as exc:
                    self.skipped(exc)
            self.log.progress(f"Tempo: {self.pages} pages, {assembler.spans:,} spans")

    def _search(self, start: int, end: int, ranks: tuple[int, int] | None, limit: int) -> list[dict]:
        params = {
            "q": self.query(ranks),
            "limit": limit,
            "spss": self.spans_per_set,
            "start": start,
            "end": end,
        }
        documents = self.get_page("/api/search", params)
        document = documents[0] if documents else {}
        if not isinstance(document, dict):
            raise SourceError("Tempo answered a search with something other than a JSON object")
        traces = document.get("traces") or []
        return [t for t in traces if isinstance(t, dict)]

    def _rank_split(
        self, traces: list[dict], ranks: tuple[int, int] | None
    ) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """Two halves of the rank range when a span set was cut at ``spss``; else ``None``."""
        if not any(_truncated(spanset) for trace in traces for spanset in _spansets(trace)):
            return None
        if ranks is None:
            seen = [as_int(a.get(c.ATTR_RANK)) for a in _attribute_maps(traces)]
            sizes = [as_int(a.get(c.ATTR_WORLD_SIZE)) for a in _attribute_maps(traces)]
            high = max([s for s in sizes if s] + [r + 1 for r in seen if r is not None] + [1])
            ranks = (0, high)
        low, high = ranks
        if high - low < 2:
            self.log.warn(
                f"a step of rank {low} has more than {self.spans_per_set} spans; some were not read"
            )
            return None
        middle = (low + high) // 2
        return (low, middle), (middle, high)


def _spansets(trace: dict) -> list[dict]:
    sets = trace.get("spanSets")
    if isinstance(sets, list):
        return [s for s in sets if isinstance(s, dict)]
    single = trace.get("spanSet")
    return [single] if isinstance(single, dict) else []


def _truncated(spanset: dict) -> bool:
    spans = spanset.get("spans") or []
    matched = as_int(spanset.get("matched"))
    return matched is not None and matched > len(spans)


def _attribute_maps(traces: list[dict]) -> Iterator[dict[str, object]]:
    for trace in traces:
        for spanset in _spansets(trace):
            for span in spanset.get("spans") or []:
                yield decode_attributes(span.get("attributes") or [], WANTED_ATTRIBUTES)


def _spans(traces: list[dict], skipped: Callable[[BaseException], None]) -> Iterator[dict[str, object]]:
    """Search-result spans as OTLP-shaped span objects (hex ids, start and end in ns).

    A span that cannot be read is passed to ``skipped`` and left out; the others still come.
    """
    for trace in traces:
        trace_id = trace_id_hex(trace.get("traceID"))
        try:
            spansets = _spansets(trace)
        except MALFORMED as exc:
            skipped(exc)
            continue
        for spanset in spansets:
            raws = spanset.get("spans") or []
            for raw in raws if isinstance(raws, list) else ():
                try:
                    attributes = raw.get("attributes") or []
                    start = as_int(raw.get("startTimeUnixNano")) or 0
                    duration = as_int(raw.get("durationNanos")) or 0
                    error = any(
                        a.get("key") == "status" and a.get("value", {}).get("stringValue") == "error"
                        for a in attributes
                    )
                except MALFORMED as exc:
                    skipped(exc)
                    continue
                yield {
                    "traceId": trace_id,
                    "spanId": span_id_hex(raw.get("spanID")),
                    "name": raw.get("name"),
                    "startTimeUnixNano": start,
                    "endTimeUnixNano": start + duration,
                    "attributes": attributes,
                    "status": {"code": 2} if error else {},
                }
