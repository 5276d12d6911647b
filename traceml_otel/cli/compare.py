"""``traceml compare``: two runs or reports, the comparison, and the exit code of a CI gate."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from traceml_otel.analyze.compare_policy import RunSummary, compare_runs, summary_of, unusable_summary
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.analyze.run_model import WindowSpec
from traceml_otel.cli.common import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_REGRESSION,
    add_format_aliases,
    add_window_arguments,
    run_command,
    window_spec,
    write_output,
)
from traceml_otel.report.compare_report import render_comparison_json, render_comparison_text
from traceml_otel.report.run_summary import summary_from_report
from traceml_otel.sanitize import strip_control


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml compare``."""
    parser.add_argument("a", type=Path, help="the baseline: a run directory, OTLP JSON file or report.json")
    parser.add_argument("b", type=Path, help="the candidate, in the same forms")
    add_window_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    add_format_aliases(parser, ("json",))
    parser.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the comparison here")
    parser.add_argument("--fail-on-regression", action="store_true", help="exit 1 when B regresses against A")


REPORT_READ_LIMIT = 64 * 1024 * 1024
"""Largest ``.json`` file read whole as a possible report."""


def load_summary(path: Path, window: WindowSpec, label: str) -> RunSummary:
    """A run summary from a JSON report, or by analysing a run directory or span files.

    A file that is neither a report nor holds any traceml spans gives a summary with no usable data
    (the comparison is then INCONCLUSIVE); a path that does not exist raises ``SourceError``.
    """
    if path.is_file() and path.suffix == ".json" and path.stat().st_size <= REPORT_READ_LIMIT:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as error:  # json.loads on any text
            return unusable_summary(label, f"not JSON ({str(error)[:80]})")
        if isinstance(document, dict) and "schema" in document:
            return summary_from_report(document, label)
    analysis = analyze_path([path], window=window)
    if not analysis.run.spans_read:
        return unusable_summary(label, "neither a traceml report nor a run with traceml spans")
    return summary_of(analysis, label)


def run_compare(args: argparse.Namespace) -> int:
    """Run ``traceml compare``; returns the exit code (see ``common``)."""
    return run_command("compare", lambda: _compare_and_write(args))


def _compare_and_write(args: argparse.Namespace) -> int:
    window = window_spec(args)
    a = load_summary(args.a, window, str(args.a))
    b = load_summary(args.b, window, str(args.b))
    comparison = compare_runs(a, b)
    text = (render_comparison_json(comparison) if args.format == "json"
            else strip_control(render_comparison_text(comparison)))
    write_output(text, args.output)
    if args.fail_on_regression and comparison.verdict == "REGRESSION":
        return EXIT_REGRESSION
    if args.fail_on_regression and comparison.verdict == "INCONCLUSIVE":
        print("traceml compare: inconclusive: " + "; ".join(comparison.notes[:1]), file=sys.stderr)
        return EXIT_INCONCLUSIVE
    return EXIT_OK
