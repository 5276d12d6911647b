"""``traceml run``: the launcher's options, the script's arguments, and the end-of-run diagnosis."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from traceml_otel.cli.analyze import diagnose_run_directory
from traceml_otel.cli.common import EXIT_ERROR


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml run``."""
    parser.add_argument("script", help="training script to launch")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments for the script: everything after its path (a leading -- is dropped)")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="processes (ranks) on this node")
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    parser.add_argument("--node-rank", type=int, default=0, help="rank of this node")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rendezvous address (multi-node)")
    parser.add_argument("--master-port", type=int, default=29500, help="rendezvous port (multi-node)")
    parser.add_argument("--run-name", help="name of the run (default: the script name)")
    parser.add_argument("--run-id", help="run id shared by all ranks (default: generated)")
    parser.add_argument("--html-report", action="store_true", help="also write report.html")
    parser.add_argument("--no-report", action="store_true", help="skip the end-of-run diagnosis")
    parser.add_argument("--no-auto-attach", action="store_true",
                        help="no zero-code tracing: do not attach to Trainer/Lightning or infer the steps of "
                             "a loop without trace_step (same as TRACEML_AUTO_ATTACH=0)")


def run_run(args: argparse.Namespace) -> int:
    """Run ``traceml run``; returns the script's exit code (2 when it cannot be launched)."""
    if importlib.util.find_spec("torch") is None:
        print("traceml run: PyTorch is not installed in this environment; install the torch build for"
              " your machine (traceml analyze and compare work without it)", file=sys.stderr)
        return EXIT_ERROR
    from traceml_otel.launch.export_report import (
        FINAL_WAIT_EXTRA_S,
        render_export_report,
        wait_for_final_exports,
    )
    from traceml_otel.launch.launcher import LaunchOptions, launch, shutdown_timeout_s

    script_args = list(args.script_args)
    if not Path(args.script).is_file():
        reason = "is a directory" if Path(args.script).is_dir() else "not found"
        print(f"traceml run: error: script {args.script} {reason}", file=sys.stderr)
        return EXIT_ERROR

    options = LaunchOptions(
        script=args.script, script_args=tuple(script_args), nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
        master_port=args.master_port, run_name=args.run_name, run_id=args.run_id,
        auto_attach=not args.no_auto_attach,
    )
    code, run_dir = launch(options)
    print()
    exports = wait_for_final_exports(run_dir, shutdown_timeout_s() + FINAL_WAIT_EXTRA_S)
    if not args.no_report and run_dir.exists():
        print(_diagnosis(run_dir, args.html_report))
    print(render_export_report(run_dir, exports))
    return code


def _diagnosis(run_dir: Path, html: bool) -> str:
    try:
        return diagnose_run_directory(run_dir, html=html)
    except Exception as error:
        return f"traceml: could not diagnose {run_dir}: {type(error).__name__}: {error}"


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traceml run")
    add_run_arguments(parser)
    return parser


def _leading_launcher_options(rest: list[str], parser: argparse.ArgumentParser) -> int:
    """How many tokens at the start of ``rest`` are ``traceml run``'s own options (with values)."""
    takes_value = {
        option: action.nargs != 0
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help")
    }
    index = 0
    while index < len(rest):
        option, inline, _ = rest[index].partition("=")
        if option not in takes_value:
            break
        index += 2 if takes_value[option] and not inline else 1
    return min(index, len(rest))


def split_script_arguments(args: argparse.Namespace, argv: Sequence[str]) -> argparse.Namespace:
    """Everything after the script goes to it, as with torchrun; one ``--`` there is accepted.

    ``run [opts] train.py --lr 1`` passes ``--lr 1``; ``run train.py -- --lr 1`` too. Launcher
    options written right after the script, before its first argument, stay launcher options:
    ``run train.py --nproc-per-node=4 --lr 1`` launches 4 ranks with ``--lr 1``, and the older
    ``run train.py --nproc-per-node 2 -- --lr 1`` works too. After ``--`` everything is the script's.
    """
    # argparse drops a "--" from REMAINDER, so read what followed the script in the raw argv.
    script_at = next(i for i, token in enumerate(argv) if i > 0 and token == args.script)
    rest = list(argv[script_at + 1:])
    run_parser = _run_parser()
    taken = _leading_launcher_options(rest, run_parser)
    between, args.script_args = rest[:taken], rest[taken:]
    if args.script_args[:1] == ["--"]:
        args.script_args = args.script_args[1:]
    if between:
        given = run_parser.parse_args([*between, args.script])
        for name, value in vars(given).items():
            if name not in ("script", "script_args") and value != run_parser.get_default(name):
                setattr(args, name, value)
    return args
