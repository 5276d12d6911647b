"""Diagnose a training run from its spans.

Read a run from the local copy, OTLP JSON files, Grafana Tempo or Jaeger, rebuild each rank's
steps, and explain where the step time goes::

    from traceml_otel.analyze import analyze_path
    from traceml_otel.report import render

    analysis = analyze_path([Path("traceml-runs/my-run")])
    print(render(analysis, "text"))
    print(analysis.step.primary.kind)        # e.g. StepKind.INPUT_BOUND

Sources live in :mod:`traceml_otel.analyze.sources` (``FileSpanSource``, ``TempoSpanSource``,
``JaegerSpanSource``). The CLI entry points (``add_analyze_arguments``/``run_analyze``,
``add_compare_arguments``/``run_compare``, ``diagnose_run_directory``) are loaded on first use, so
importing this package does not import the reporters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.findings import Finding, RunAnalysis
from traceml_otel.analyze.kinds import Clock, MemoryKind, Severity, StepKind
from traceml_otel.analyze.pipeline import analyze_path, analyze_source
from traceml_otel.analyze.records import StepTiming, WindowSpec
from traceml_otel.analyze.sources.base import SourceError

if TYPE_CHECKING:
    from traceml_otel.analyze.commands import (
        add_analyze_arguments,
        add_compare_arguments,
        diagnose_run_directory,
        run_analyze,
        run_compare,
    )

_COMMANDS = frozenset(
    {"add_analyze_arguments", "add_compare_arguments", "diagnose_run_directory", "run_analyze", "run_compare"}
)

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
    "add_analyze_arguments",
    "add_compare_arguments",
    "analyze_path",
    "analyze_run",
    "analyze_source",
    "diagnose_run_directory",
    "run_analyze",
    "run_compare",
]


def __getattr__(name: str) -> object:
    """Load the CLI entry points lazily (they import the reporters, which import this package)."""
    if name in _COMMANDS:
        from traceml_otel.analyze import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
