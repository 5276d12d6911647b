"""Span sources: where a run's spans are read from.

``SpanSource`` (in ``base``) is the interface; ``FileSpanSource`` reads the local copy and OTLP
JSON files, ``TempoSpanSource`` queries Grafana Tempo's TraceQL search, ``JaegerSpanSource``
Jaeger's API v3. Each ``load()`` returns a :class:`~traceml_otel.analyze.run_model.LoadedRun`.
"""

from __future__ import annotations

from traceml_otel.analyze.sources.base import ReadLog, SourceError, SpanSource
from traceml_otel.analyze.sources.files import FileSpanSource

__all__ = ["FileSpanSource", "ReadLog", "SourceError", "SpanSource"]
