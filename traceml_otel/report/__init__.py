"""Reports of a run analysis: text (the Verdict / Why / Next card), versioned JSON, and HTML.

    from traceml_otel.report import render
    print(render(analysis, "text"))

``run_summary`` reads a JSON report for ``compare`` (whose policy is ``traceml_otel.analyze.compare_policy``);
``compare_report`` renders a comparison.
"""

from __future__ import annotations

from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.errors import UsageError
from traceml_otel.report.html import HtmlReporter
from traceml_otel.report.json_report import SCHEMA, SCHEMA_VERSION, JsonReporter, report_json
from traceml_otel.report.text import TextReporter
from traceml_otel.sanitize import strip_control

FORMATS = ("text", "json", "html")
_REPORTERS = {"text": TextReporter, "json": JsonReporter, "html": HtmlReporter}

__all__ = [
    "FORMATS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "HtmlReporter",
    "JsonReporter",
    "TextReporter",
    "render",
    "report_json",
]


def render(analysis: RunAnalysis, fmt: str = "text", *, trace_url: str | None = None) -> str:
    """``analysis`` as a ``text``, ``json`` or ``html`` document.

    ``trace_url``: a link template with ``{trace_id}`` (Tempo, Jaeger, Grafana Explore); trace ids
    then become links (HTML) or URLs (text, JSON ``trace_url``).
    """
    try:
        reporter = _REPORTERS[fmt](trace_url=trace_url)
    except KeyError:
        raise UsageError(f"unknown report format {fmt!r}; choose from {', '.join(FORMATS)}") from None
    document = reporter.render(analysis)
    # Span data reaches the terminal in text: no escape sequences from a hostile run id or host name.
    return strip_control(document) if fmt == "text" else document
