"""A run's local copy passed through the emitter's span budget, as the OTLP spans it would have exported.

The local copy holds every step. :func:`sample_run_spans` replays each rank's steps, in order and in
batches, through :class:`~traceml_otel.emit.span_budget.SpanBudget` (the emitter's own decision code)
and keeps the spans of the steps it keeps, with the ``tracestate`` and ``traceml.sampling.threshold``
attribute the emitter would have written. Tests and benchmarks compare the analyzer on both.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.span_budget import BudgetSettings, SpanBudget
from traceml_otel.step_records import StepRecord

BATCH = 64
"""Steps per emitter batch in the replay."""


def _value(raw: dict[str, Any]) -> Any:
    (kind, value), = raw.items()
    if kind == "intValue":
        return int(value)
    return value


def attributes(span: dict[str, Any]) -> dict[str, Any]:
    """An OTLP JSON span's attributes as a dict."""
    return {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}


def read_local_spans(run_dir: Path) -> list[dict[str, Any]]:
    """Every span of the run's local copy, as OTLP JSON span objects."""
    spans = []
    for path in sorted(run_dir.glob("rank-*.traces.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                for resource in json.loads(line)["resourceSpans"]:
                    for scope in resource["scopeSpans"]:
                        spans.extend(scope["spans"])
    return spans


def _record(span: dict[str, Any], attrs: dict[str, Any]) -> StepRecord:
    def ns(name: str) -> int | None:
        value = attrs.get(name)
        return None if value is None else int(float(value) * 1e9)

    return StepRecord(
        step=attrs[c.ATTR_STEP], start_ns=int(span["startTimeUnixNano"]), end_ns=int(span["endTimeUnixNano"]),
        phases=(), input_wait_ns=ns(c.ATTR_INPUT_WAIT_CPU), between_steps_ns=ns(c.ATTR_BETWEEN_STEPS_CPU),
        exception_type=attrs.get(c.ATTR_EXCEPTION_TYPE),
    )


def sample_run_spans(spans: list[dict[str, Any]], settings: BudgetSettings, world_size: int,
                     ) -> tuple[list[dict[str, Any]], dict[int, set[int]]]:
    """The spans the budget exports (copies, with tracestate and threshold), and the kept steps by rank."""
    steps: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    per_step: dict[tuple[object, str], int] = defaultdict(int)
    for span in spans:
        per_step[attributes(span).get(c.ATTR_RANK), span["traceId"]] += 1
        if span["name"] == c.SPAN_STEP:
            attrs = attributes(span)
            steps[attrs[c.ATTR_RANK]].append((span, attrs))
    decided: dict[tuple[int, str], tuple[str, str]] = {}
    kept: dict[int, set[int]] = defaultdict(set)
    for rank, rows in steps.items():
        rows.sort(key=lambda row: row[1][c.ATTR_STEP])
        budget = SpanBudget(settings, world_size)
        for i in range(0, len(rows), BATCH):
            chunk = rows[i:i + BATCH]
            records = [_record(span, attrs) for span, attrs in chunk]
            counts = [per_step[rank, span["traceId"]] for span, _ in chunk]
            decisions = budget.decide(records, [int(span["traceId"], 16) for span, _ in chunk], counts)
            for (span, attrs), decision in zip(chunk, decisions or [None] * len(chunk), strict=True):
                if decisions is None or decision is not None:
                    state = "" if decisions is None else decision.trace_state
                    th = "" if decisions is None else decision.th
                    decided[rank, span["traceId"]] = (state, th)
                    kept[rank].add(attrs[c.ATTR_STEP])
    out = []
    for span in spans:
        attrs = attributes(span)
        key = (attrs.get(c.ATTR_RANK), span["traceId"])
        if key not in decided:
            if span["name"] == c.SPAN_HANG:  # hang spans are always sent
                out.append(span)
            continue
        state, th = decided[key]
        copy = dict(span)
        if state:
            copy["traceState"] = state
            if span["name"] == c.SPAN_STEP:
                copy["attributes"] = [*span["attributes"],
                                      {"key": c.ATTR_SAMPLING_THRESHOLD, "value": {"stringValue": th}}]
        out.append(copy)
    return out, kept
