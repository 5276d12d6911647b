"""``traceml compare``: two runs or reports, or two sides of several, the comparison, and the exit
code of a CI gate.

``traceml compare A B`` compares one run with another; ``traceml compare A1 A2 A3 --against B1 B2 B3``
pools several runs per side (run folders, span files, ``report.json`` files, globs, or a folder that
holds run folders).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

from traceml_otel.analyze.compare_policy import compare_runs
from traceml_otel.analyze.compare_sides import pool_side
from traceml_otel.analyze.compare_summary import RunSummary, summary_of, unusable_summary
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
from traceml_otel.contract import MANIFEST_FILE
from traceml_otel.errors import UsageError
from traceml_otel.report.compare_html import render_comparison_html
from traceml_otel.report.compare_report import render_comparison_json, render_comparison_text
from traceml_otel.report.run_summary import summary_from_report
from traceml_otel.sanitize import strip_control

MAX_RUNS_PER_SIDE = 64
"""Runs one side may pool (a glob that matches more is refused)."""
FORMATS = ("text", "json", "html")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml compare``."""
    parser.add_argument("runs", type=str, nargs="+", metavar="RUN",
                        help="A B (baseline, candidate), or the baseline's runs when --against is given: run "
                             "directories, OTLP JSON files, report.json files, globs, or a folder of runs")
    parser.add_argument("--against", type=str, nargs="+", metavar="RUN",
                        help="the candidate's runs, in the same forms (several runs per side pool their "
                             "spread)")
    add_window_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    add_format_aliases(parser, ("json", "html"))
    parser.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the comparison here")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 on a REGRESSION, 3 when a side has no usable or bad data")


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


def _is_run_dir(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file() or any(path.glob("rank-*.traces.jsonl"))


def expand(arguments: list[str]) -> list[Path]:
    """Paths of one side: globs expanded (sorted), a folder holding run folders (and no run of its own)
    replaced by those run folders; a path that does not exist is kept (its reading says so)."""
    paths: list[Path] = []
    for argument in arguments:
        matches = sorted(glob.glob(argument)) if glob.has_magic(argument) else [argument]
        if not matches:
            raise UsageError(f"no run matches {strip_control(argument)[:200]!r}")
        for match in map(Path, matches):
            if match.is_dir() and not _is_run_dir(match):
                runs = sorted(p for p in match.iterdir() if p.is_dir() and _is_run_dir(p))
                paths += runs or [match]
            else:
                paths.append(match)
    if len(paths) > MAX_RUNS_PER_SIDE:
        raise UsageError(f"{len(paths)} runs on one side; at most {MAX_RUNS_PER_SIDE}")
    return paths


def sides(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """The baseline's and the candidate's paths."""
    if args.against:
        return expand(args.runs), expand(args.against)
    if len(args.runs) != 2:
        raise UsageError("give two runs (A B), or the baseline's runs followed by --against and the "
                         "candidate's runs")
    return expand(args.runs[:1]), expand(args.runs[1:])


def load_side(paths: list[Path], window: WindowSpec, name: str) -> RunSummary:
    """One side's summary: the run itself, or its runs pooled."""
    summaries = [load_summary(path, window, str(path)) for path in paths]
    if len(summaries) == 1:
        return summaries[0]
    return pool_side(summaries, f"{name}: {len(summaries)} runs ({paths[0]}, ...)")


def run_compare(args: argparse.Namespace) -> int:
    """Run ``traceml compare``; returns the exit code (see ``common``)."""
    return run_command("compare", lambda: _compare_and_write(args))


def render(comparison: object, fmt: str) -> str:
    if fmt == "json":
        return render_comparison_json(comparison)  # type: ignore[arg-type]
    if fmt == "html":
        return render_comparison_html(comparison)  # type: ignore[arg-type]
    return strip_control(render_comparison_text(comparison))  # type: ignore[arg-type]


def _compare_and_write(args: argparse.Namespace) -> int:
    window = window_spec(args)
    if args.format == "html" and args.output is None and sys.stdout.isatty():
        raise UsageError("--format html writes a page: give -o PATH (or redirect the output)")
    paths_a, paths_b = sides(args)
    a = load_side(paths_a, window, "A")
    b = load_side(paths_b, window, "B")
    comparison = compare_runs(a, b)
    write_output(render(comparison, args.format), args.output)
    if args.fail_on_regression and comparison.verdict == "REGRESSION":
        return EXIT_REGRESSION
    if args.fail_on_regression and not comparison.usable:
        print("traceml compare: inconclusive: " + strip_control("; ".join(comparison.notes[:1]))[:300],
              file=sys.stderr)
        return EXIT_INCONCLUSIVE
    return EXIT_OK
