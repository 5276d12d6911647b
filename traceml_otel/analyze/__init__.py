"""Diagnose a training run from its spans.

Read a run from the local copy, OTLP JSON files, Grafana Tempo or Jaeger, rebuild each rank's
steps, and explain where the step time goes::

    from traceml_otel.analyze import analyze_path
    from traceml_otel.report import render

    analysis = analyze_path([Path("traceml-runs/my-run")])
    print(render(analysis, "text"))
    print(analysis.step.primary.kind)        # e.g. StepKind.INPUT_BOUND

Sources live in :mod:`traceml_otel.analyze.sources` (``FileSpanSource``, ``TempoSpanSource``,
``JaegerSpanSource``); the ``compare`` policy in :mod:`traceml_otel.analyze.compare_policy`;
every threshold in :mod:`traceml_otel.analyze.thresholds`. This package is a library: it imports
only the standard library, ``contract``, ``sanitize`` and ``wire``, never ``report``,
``capture``, ``emit``, ``launch`` or ``cli`` (``tests/test_import_direction.py``).
The commands are in :mod:`traceml_otel.cli`.
"""

from __future__ import annotations

from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.findings import Finding
from traceml_otel.analyze.kinds import Clock, MemoryKind, Severity, StepKind
from traceml_otel.analyze.pipeline import analyze_path, analyze_source
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import StepTiming, WindowSpec
from traceml_otel.analyze.sources.base import SourceError

__all__ = [
    "Clock",
    "Finding",
    "MemoryKind",
    "RunAnalysis",
    "Severity",
    "SourceError",
    "StepKind",
    "StepTiming",
    "WindowSpec",
    "analyze_path",
    "analyze_run",
    "analyze_source",
]

