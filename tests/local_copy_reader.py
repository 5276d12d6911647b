"""Test helper: read a local copy back through the OTLP protobuf schema (strict parse)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData


@dataclass(frozen=True)
class ParsedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def parse_line(line: str) -> TracesData:
    """Parse one OTLP-JSON line strictly (hex ids as the spec requires) into TracesData."""
    raw = json.loads(line)
    for resource_spans in raw["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        assert len(span[key]) in (16, 32), f"{key} is not hex: {span[key]}"
                        span[key] = _b64(span[key])
    return json_format.ParseDict(raw, TracesData())


def read_spans(path: Path) -> list[ParsedSpan]:
    spans = []
    for line in path.read_text().splitlines():
        data = parse_line(line)
        for resource_spans in data.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ParsedSpan(
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes}, resource=resource,
                    ))
    return spans


def read_run(run_dir: Path) -> list[ParsedSpan]:
    spans = []
    for path in sorted(run_dir.glob("rank-*.traces.jsonl")):
        spans.extend(read_spans(path))
    return spans
