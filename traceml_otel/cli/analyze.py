"""``traceml analyze``, and the diagnosis ``traceml run`` prints and writes when the script ends.

Thin: parse arguments, pick a span source, call the analyzer and a reporter, write the report,
set the exit code (see ``common`` for the codes).
"""

from __future__ import annotations

import argparse
import errno
import sys
from datetime import datetime
from pathlib import Path

from traceml_otel.analyze.from_metrics import analyze_metrics
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.pipeline import ENGINES, analyze_path, analyze_source
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.sources.base import SourceError, SpanSource
from traceml_otel.analyze.sources.http import DEFAULT_MAX_BYTES, DEFAULT_TOTAL_S, ReadLimits
from traceml_otel.analyze.sources.jaeger import JaegerSpanSource
from traceml_otel.analyze.sources.prometheus import PrometheusReader
from traceml_otel.analyze.sources.tempo import TempoSpanSource
from traceml_otel.analyze.timerange import rfc3339, time_range
from traceml_otel.cli.common import (
    EXIT_NO_DATA,
    EXIT_OK,
    add_format_aliases,
    add_window_arguments,
    run_command,
    window_spec,
    write_output,
)
from traceml_otel.errors import SettingsError, UsageError
from traceml_otel.report import FORMATS, render
from traceml_otel.sanitize import one_line
from traceml_otel.settings import trace_url_template
from traceml_otel.wire._json import write_atomically

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml analyze``."""
    parser.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        metavar="RUN_DIR | FILE",
        help="a run directory of the local copy, or OTLP JSON (Lines) files",
    )
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--tempo", metavar="URL", help="read the run from Grafana Tempo (TraceQL search)")
    backend.add_argument("--jaeger", metavar="URL", help="read the run from Jaeger (API v3)")
    backend.add_argument(
        "--prometheus", metavar="URL",
        help="diagnose from the run's metrics in a Prometheus-compatible query API (Prometheus, Mimir, "
             "Thanos, VictoriaMetrics), aggregated there with PromQL; needs --run-id",
    )
    parser.add_argument("--run-id", help="the run to analyse (required with --tempo and --prometheus)")
    parser.add_argument("--service", help="only spans of this service.name (required with --jaeger)")
    parser.add_argument(
        "--since", metavar="T", help="backend search start: unix seconds, ISO 8601 or an age (2h)"
    )
    parser.add_argument("--until", metavar="T", help="backend search end (default: now)")
    parser.add_argument(
        "--engine", choices=ENGINES, default="auto",
        help="for a run directory: 'python' reads the spans; 'columnar' the step tables in DuckDB "
             "(pip install 'traceml-otel[columnar]'); 'auto' (default) takes columnar for 64 MiB of spans "
             "or more when DuckDB is installed and the tables are complete",
    )
    add_window_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    add_format_aliases(parser, ("json", "html"))
    parser.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the report here, not stdout")
    parser.add_argument(
        "--trace-url", metavar="TEMPLATE",
        help="link trace ids in the report: a URL with {trace_id}, e.g. http://jaeger:16686/trace/{trace_id} "
             "(default: TRACEML_TRACE_URL)",
    )
    parser.add_argument("--page-size", type=int, default=500, help="traces per backend request (default 500)")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for each backend socket read"
    )
    parser.add_argument(
        "--read-deadline", type=float, default=DEFAULT_TOTAL_S, metavar="S",
        help=f"seconds all backend requests may take together (default {DEFAULT_TOTAL_S:g})",
    )
    parser.add_argument(
        "--max-response-mb", type=float, default=DEFAULT_MAX_BYTES / 2**20, metavar="MB",
        help=f"largest backend answer read, in MiB (default {DEFAULT_MAX_BYTES // 2**20})",
    )


def _limits(args: argparse.Namespace) -> ReadLimits:
    if args.read_deadline <= 0 or args.max_response_mb <= 0 or args.timeout <= 0:
        raise UsageError("--timeout, --read-deadline and --max-response-mb must be positive")
    return ReadLimits(timeout=args.timeout, total_s=args.read_deadline,
                      max_bytes=int(args.max_response_mb * 2**20))


def _backend(args: argparse.Namespace) -> SpanSource:
    when = time_range(args.since, args.until)
    limits = _limits(args)
    backend = TempoSpanSource if args.tempo else JaegerSpanSource
    return backend(
        args.tempo or args.jaeger,
        run_id=args.run_id,
        service=args.service,
        when=when,
        page_size=args.page_size,
        timeout=args.timeout,
        limits=limits,
    )


def _from_prometheus(args: argparse.Namespace) -> RunAnalysis:
    """The diagnosis from the run's metrics, summed by the engine (``--since``/``--until`` bound it)."""
    if args.inputs:
        raise UsageError("give either files or a backend (--prometheus), not both")
    if window_spec(args).mode != "run":
        raise UsageError("--prometheus reads totals over a time range: choose it with --since/--until, "
                         "not a step window")
    if not args.run_id:
        raise UsageError("--prometheus needs --run-id (the traceml_run_id label of the run)")
    when = time_range(args.since, args.until)
    reader = PrometheusReader(args.prometheus, run_id=args.run_id, when=when, timeout=args.timeout,
                              limits=_limits(args))
    window = f"{rfc3339(when.start)} .. {rfc3339(when.end)}"
    return analyze_metrics(reader.read(), window)


def _analyze(args: argparse.Namespace) -> RunAnalysis:
    if getattr(args, "prometheus", None):
        return _from_prometheus(args)
    window = window_spec(args)
    if args.tempo or args.jaeger:
        if args.inputs:
            raise UsageError("give either files or a backend (--tempo/--jaeger), not both")
        return analyze_source(_backend(args), window)
    if not args.inputs:
        raise UsageError("nothing to analyse: give a run directory, OTLP JSON files, --tempo or --jaeger")
    if len(args.inputs) == 1:
        listing = runs_inside(args.inputs[0])
        if listing:
            raise RunsFolderGiven(listing)
    for path in args.inputs:
        kind = _report_kind(path)
        if kind:
            raise UsageError(
                f"{path} is a traceml {kind} (its diagnosis is already in it), not spans: analyse the run "
                "directory or span files, or compare reports with `traceml compare A.json B.json`"
            )
    return analyze_path(args.inputs, run_id=args.run_id, service=args.service, window=window,
                        engine=args.engine)


MAX_LISTED_RUNS = 20


def runs_inside(folder: Path) -> str:
    """For a folder of run directories (``traceml-runs``), the runs it holds, newest first, and how to
    pick one; empty when ``folder`` is itself a run (or holds none)."""
    if not folder.is_dir() or any(folder.glob("rank-*.traces.jsonl")) or (folder / "manifest.json").exists():
        return ""
    runs = []
    for child in folder.iterdir():
        if not child.is_dir() or child.is_symlink():
            continue
        traced = any(child.glob("rank-*.traces.jsonl"))
        if traced or (child / "manifest.json").is_file():
            try:
                runs.append((child.stat().st_mtime, child, traced))
            except OSError:
                continue
    if not runs:
        return ""
    runs.sort(key=lambda item: (-item[0], item[1].name))
    count = f"{len(runs)} run{'' if len(runs) == 1 else 's'}"
    lines = [f"{one_line(folder)} is a runs folder with {count} (newest first); analyze one of them:"]
    for when, run, traced in runs[:MAX_LISTED_RUNS]:
        stamp = datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"  {stamp}  {one_line(run)}{'' if traced else '  (no steps traced)'}")
    if len(runs) > MAX_LISTED_RUNS:
        lines.append(f"  ... and {len(runs) - MAX_LISTED_RUNS} older")
    example = next((run for _, run, traced in runs if traced), runs[0][1])
    lines.append(f"e.g. traceml analyze {one_line(example)}")
    return "\n".join(lines)


def _report_kind(path: Path) -> str:
    """``report`` or ``comparison`` when ``path`` is one of our JSON documents, else empty."""
    if not path.is_file():
        return ""
    try:
        with path.open("rb") as handle:
            head = handle.read(512)
    except OSError:
        return ""
    if b'"schema": "traceml-otel/report"' in head:
        return "report"
    if b'"schema": "traceml-otel/compare"' in head:
        return "comparison"
    return ""


class RunsFolderGiven(UsageError):
    """A folder of runs was named instead of one run; the message lists them, one per line."""

    multiline = True  # our own lines (paths already stripped of control characters)

    def __init__(self, listing: str) -> None:
        super().__init__(listing)
        self.listing = listing


def run_analyze(args: argparse.Namespace) -> int:
    """Run ``traceml analyze``; returns the exit code (see ``common``)."""
    return run_command("analyze", lambda: _analyze_and_write(args))


def _analyze_and_write(args: argparse.Namespace) -> int:
    trace_url = trace_url_template(getattr(args, "trace_url", None))
    output = _html_destination(args)
    try:
        analysis = _analyze(args)
    except RunsFolderGiven as folder:
        if args.format != "text" or args.output is not None:
            raise  # a report was asked for: no report is an error (exit 2), with the list of runs
        print(folder.listing)  # asked plainly, the list of runs is the answer
        return EXIT_OK
    write_output(render(analysis, args.format, trace_url=trace_url), output)
    return EXIT_NO_DATA if analysis.step.primary.kind is StepKind.NO_DATA else EXIT_OK


def _html_destination(args: argparse.Namespace) -> Path | None:
    """Where an HTML report goes: ``-o``; else, on a terminal, ``report.html`` in the one run folder
    given (a page of HTML on a terminal helps nobody), or an error asking for ``-o``."""
    if args.format != "html" or args.output is not None or not sys.stdout.isatty():
        return args.output
    inputs = list(args.inputs or ())
    if len(inputs) == 1 and inputs[0].is_dir() and not runs_inside(inputs[0]):
        return inputs[0] / REPORT_HTML
    raise UsageError("an HTML report goes to a file: add -o report.html (or pipe the output)")


def diagnose_run_directory(run_dir: Path, *, html: bool = False) -> str:
    """Diagnose the local copy in ``run_dir``; write ``report.json`` (and ``report.html``) there.

    Returns the text report to print at the end of ``traceml run``.
    """
    run_dir = Path(run_dir)
    if run_dir.is_symlink():
        return f"traceml: no diagnosis: {run_dir} is a symbolic link; not followed (planted?)\n"
    try:
        analysis = analyze_path([run_dir])
    except SourceError as error:
        return f"traceml: no diagnosis: {error}\n"
    try:
        trace_url = trace_url_template()
    except SettingsError as error:
        print(f"traceml: trace links off: {error}", file=sys.stderr)
        trace_url = None
    lines = []
    for name, fmt in ((REPORT_JSON, "json"), *(((REPORT_HTML, "html"),) if html else ())):
        try:  # a read-only or full disk costs the report file, not the diagnosis
            write_atomically(run_dir / name, render(analysis, fmt, trace_url=trace_url))
            lines.append(f"Report: {one_line(run_dir / name)}\n")
        except OSError as error:
            reason = error.strerror if error.errno == errno.ELOOP and error.strerror else error
            lines.append(f"Report: not written to {one_line(run_dir / name)} "
                         f"({type(error).__name__}: {reason})\n")
    return render(analysis, "text", trace_url=trace_url) + "".join(lines)
