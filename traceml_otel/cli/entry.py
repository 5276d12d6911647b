"""The ``traceml`` parser and the dispatch to ``run``, ``analyze``, ``compare`` and ``stack``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from traceml_otel._version import __version__
from traceml_otel.cli.common import run_command
from traceml_otel.cli.parser import CommandParser
from traceml_otel.cli.run import add_run_arguments, run_run, split_script_arguments, unknown_launcher_option


def build_parser(launch_only: bool = False) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; with ``launch_only``, of ``traceml run`` alone (the
    launcher then never imports the analyzer: its diagnosis runs in a child process)."""
    parser = CommandParser(prog="traceml", description="PyTorch step telemetry on OpenTelemetry.")
    parser.add_argument("--version", action="version", version=f"traceml-otel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(commands.add_parser(
        "run", help="launch a script through torch.distributed.run and diagnose it",
        description="Launch SCRIPT on every rank. Options go before SCRIPT (or right after it, before "
                    "the script's first argument); the rest goes to the script, as with torchrun "
                    "(`--` before the script's arguments is accepted).",
    ))
    if launch_only:
        return parser
    from traceml_otel.cli.analyze import add_analyze_arguments
    from traceml_otel.cli.compare import add_compare_arguments
    from traceml_otel.cli.stack import add_stack_arguments

    add_stack_arguments(commands.add_parser("stack", help="render alert rules, dashboard and manifests"))
    add_analyze_arguments(
        commands.add_parser("analyze", aliases=["analyse"], help="diagnose a run from its spans")
    )
    add_compare_arguments(commands.add_parser("compare", help="compare two runs or reports"))
    from traceml_otel.cli.top import add_top_arguments

    add_top_arguments(commands.add_parser("top", help="watch a run live (a run folder, or Prometheus)"))
    from traceml_otel.cli.capture import add_capture_arguments

    add_capture_arguments(commands.add_parser("capture", help="ask a running job for a profiler capture"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``traceml`` and ``traceml-otel``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        problem = unknown_launcher_option(argv)
        if problem:
            print(f"traceml run: error: {problem}; see traceml run --help", file=sys.stderr)
            return 2
    args = build_parser(launch_only=argv[:1] == ["run"]).parse_args(argv)
    if args.command == "analyse":  # the British spelling is the same command
        args.command = "analyze"
    # Each command maps its own errors; what still escapes is a user's error (exit 2) or a bug (exit 70).
    if args.command == "run":
        return run_command("run", lambda: run_run(split_script_arguments(args, argv)))
    from traceml_otel.cli.analyze import run_analyze
    from traceml_otel.cli.compare import run_compare
    from traceml_otel.cli.stack import run_stack

    if args.command == "stack":
        return run_command("stack", lambda: run_stack(args))
    if args.command == "capture":
        from traceml_otel.cli.capture import run_capture

        return run_command("capture", lambda: run_capture(args))
    if args.command == "top":
        from traceml_otel.cli.top import run_top

        return run_command("top", lambda: run_top(args))
    command = run_analyze if args.command == "analyze" else run_compare
    return run_command(args.command, lambda: command(args))
