"""The local copy: one rank's spans as OTLP JSON Lines, as the collector's file exporter writes.

Encoding uses the SDK's own OTLP protobuf encoder and protobuf's JSON mapping; the one
thing written by hand is turning the ids from protobuf-JSON base64 into the hex the OTLP
JSON spec requires. (The official ``otlp-json-file`` exporter is beta and pins other
versions of the OTLP packages than the stable exporters, so it cannot be installed
beside them yet.)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(span: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        value = span.get(key)
        if value:
            span[key] = base64.b64decode(value).hex()
    for link in span.get("links", ()):
        _hex_ids(link)


def traces_data_json(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP ``TracesData`` JSON line (no newline) for ``spans``."""
    message = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in message.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
    return json.dumps(message, separators=(",", ":"))


class LocalCopySpanExporter(SpanExporter):
    """Appends each batch as one line to ``path`` and flushes it to the OS at once.

    Flushing per batch means a crash of the emitter itself loses at most the batch in hand.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self.spans_written = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        self._file.write(traces_data_json(spans) + "\n")
        self._file.flush()
        self.spans_written += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if not self._file.closed:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if not self._file.closed:
            self._file.flush()
        return True
