"""``traceml run``: the launcher's options, the script's arguments, and the end-of-run diagnosis."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_otel.cli.common import EXIT_ERROR
from traceml_otel.cli.parser import CommandParser
from traceml_otel.cli.run_diagnosis import DiagnosisProcess, diagnose_in_child, start_diagnosis
from traceml_otel.errors import SettingsError
from traceml_otel.sanitize import one_line
from traceml_otel.settings import (
    live_interval_s,
    live_mode,
)

if TYPE_CHECKING:
    from traceml_otel.launch.launcher import LaunchOptions


def _at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, with a plain error otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds, at least 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 1.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text}")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml run``."""
    parser.add_argument("script", help="training script to launch (a module name with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments for the script: everything after its path (a leading -- is dropped)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module, run as `python -m SCRIPT` (as torchrun's -m)")
    parser.add_argument("--nproc-per-node", type=_at_least(1), default=1,
                        help="processes (ranks) on this node")
    parser.add_argument("--nnodes", type=_at_least(1), default=1, help="number of nodes")
    parser.add_argument("--node-rank", type=_at_least(0), default=0, help="rank of this node")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rendezvous address (multi-node)")
    parser.add_argument("--master-port", type=_at_least(1, 65535), default=29500,
                        help="rendezvous port (multi-node)")
    parser.add_argument("--max-restarts", type=_at_least(0), default=0,
                        help="restart every rank up to N times after a failure (torchrun's --max-restarts)")
    parser.add_argument("--run-name", help="name of the run (default: the script name); the same characters "
                                           "as --run-id")
    parser.add_argument("--run-id", help="run id shared by all ranks (default: generated): 1 to 128 ASCII "
                                         "letters, digits, '.', '_', '-', starting with a letter or digit")
    parser.add_argument("--resume", action="store_true",
                        help="write into the folder of a --run-id that already holds data (the same run "
                             "continued); without it such an id is refused")
    parser.add_argument("--html-report", "--html", action="store_true", help="also write report.html")
    parser.add_argument("--no-report", action="store_true", help="skip the end-of-run diagnosis")
    parser.add_argument("--hang-action", choices=("report", "terminate"), default="report",
                        help="when ranks hang: report it on stderr (default), or also end the job "
                             "(exit code 75) once every rank's hang record is written")
    parser.add_argument("--live", choices=("auto", "panel", "lines", "off"), default=None,
                        help="live view while the job runs: a panel under the script's output on a terminal, "
                             "a line every --live-interval seconds otherwise (default auto; TRACEML_LIVE)")
    parser.add_argument("--live-interval", type=_positive_seconds, default=None, metavar="SECONDS",
                        help="seconds between live lines (default 30; TRACEML_LIVE_INTERVAL_S)")
    parser.add_argument("--no-auto-attach", action="store_true",
                        help="no zero-code tracing: do not attach to Trainer/Lightning or infer the steps of "
                             "a loop without trace_step (same as TRACEML_AUTO_ATTACH=0)")


def unknown_launcher_option(argv: Sequence[str]) -> str | None:
    """The error for an option before the script that ``traceml run`` does not know, with the closest
    known one (``--nprocs-per-node``: did you mean ``--nproc-per-node``?); ``None`` when all are known."""
    parser = _run_parser()
    known = [o for action in parser._actions for o in action.option_strings]
    takes_value = {o for action in parser._actions if action.nargs != 0 for o in action.option_strings}
    index = 1  # argv[0] is "run"
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
        option = argv[index].partition("=")[0]
        if option not in known:
            long_options = [o for o in known if o.startswith("--")]
            close = difflib.get_close_matches(option, long_options, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f"; its options: {', '.join(sorted(known))}"
            return f"unknown option {option}{hint}"
        index += 2 if option in takes_value and "=" not in argv[index] else 1
    return None


def _near_miss_after_script(args: argparse.Namespace) -> None:
    """A script argument that looks like a mistyped launcher option gets a hint (it is still passed)."""
    known = [o for action in _run_parser()._actions for o in action.option_strings if o.startswith("--")]
    first = args.script_args[0].partition("=")[0] if args.script_args else ""
    if first.startswith("--") and first not in known:
        close = difflib.get_close_matches(first, known, n=1, cutoff=0.85)
        if close:
            print(f"traceml run: note: {first} goes to the script; did you mean traceml run's {close[0]}?",
                  file=sys.stderr)


def run_run(args: argparse.Namespace) -> int:
    """Run ``traceml run``; returns the script's exit code (2 when it cannot be launched)."""
    if importlib.util.find_spec("torch") is None:
        print("traceml run: PyTorch is not installed in this environment; install the torch build for"
              " your machine (traceml analyze and compare work without it)", file=sys.stderr)
        return EXIT_ERROR
    from traceml_otel.launch.launcher import LaunchOptions

    script_args = list(args.script_args)
    problem = _script_problem(args)
    if problem:
        print(f"traceml run: error: {problem}", file=sys.stderr)
        return EXIT_ERROR
    _near_miss_after_script(args)

    try:
        live = args.live or live_mode()
        live_interval = args.live_interval or live_interval_s()
    except SettingsError as error:
        print(f"traceml run: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    options = LaunchOptions(
        live=live, live_interval_s=live_interval,
        script=args.script, script_args=tuple(script_args), nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
        master_port=args.master_port, run_name=args.run_name, run_id=args.run_id, module=args.module,
        hang_action=args.hang_action, auto_attach=not args.no_auto_attach, max_restarts=args.max_restarts,
        resume=args.resume,
    )
    diagnosis = None if args.no_report else start_diagnosis()  # imports the analyzer while the job runs
    try:
        return _launch_and_report(args, options, diagnosis)
    finally:
        if diagnosis is not None:
            diagnosis.close()


def _launch_and_report(args: argparse.Namespace, options: LaunchOptions,
                       diagnosis: DiagnosisProcess | None) -> int:
    """Run the job, then print its diagnosis (from ``diagnosis``, started with the job) and the account."""
    from traceml_otel.launch.export_report import (
        FINAL_WAIT_EXTRA_S,
        render_export_report,
        wait_for_final_exports,
    )
    from traceml_otel.launch.launcher import launch, ranks_shutdown_timeout_s

    code, run_dir = launch(options)
    print()
    exports = wait_for_final_exports(run_dir, ranks_shutdown_timeout_s() + FINAL_WAIT_EXTRA_S)
    if not exports and code != 0 and run_dir.is_dir() and os.access(run_dir, os.W_OK):
        # The script stopped before traceml.init(): its own error is the last thing above; say so, briefly.
        # (A runs folder we could not write holds no statistics either: the account below says why.)
        print(f"traceml run: the script exited with code {code} before telemetry started (it never reached "
              f"traceml.init()): see its error above. Nothing was traced; {one_line(run_dir)} holds only the "
              "manifest.",
              file=sys.stderr)
        return code
    if not args.no_report and run_dir.exists():
        began = time.monotonic()
        text = diagnosis.report(run_dir, args.html_report) if diagnosis else diagnose_in_child(
            run_dir, args.html_report)
        print(text)
        _bill_diagnosis(run_dir, time.monotonic() - began)
    print(render_export_report(run_dir, exports))
    return code


DIAGNOSIS_LINE_S = 2.0
"""A diagnosis that took at least this long says so in one line."""


def _bill_diagnosis(run_dir: Path, seconds: float) -> None:
    """Record the diagnosis's duration in the manifest (``diagnosis_s``: billed to ``telemetry`` by later
    analyses, since the job still held its machines), and say so when it was long."""
    from dataclasses import replace

    from traceml_otel.wire.manifest import read_manifest, write_manifest

    found = read_manifest(run_dir).manifest
    if found is not None and found.written_by is None:
        try:
            write_manifest(run_dir, replace(found, diagnosis_s=round(seconds, 3)))
        except OSError:
            pass  # a read-only or full disk: the account then leaves the diagnosis out (as before)
    if seconds >= DIAGNOSIS_LINE_S:
        print(f"traceml: the diagnosis took {seconds:.1f} s after the job (telemetry's own time; "
              "--no-report skips it)", file=sys.stderr)


def _script_problem(args: argparse.Namespace) -> str | None:
    """Why the script or module cannot be launched, checked before any process starts."""
    if args.module:
        if args.script.endswith(".py") or "/" in args.script:
            return f"-m takes a module name (e.g. pkg.train), not a path: {args.script}"
        sys.path.insert(0, str(Path.cwd()))  # `python -m` looks in the working directory first
        try:
            found = importlib.util.find_spec(args.script) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        return None if found else f"no module named {args.script} (from {Path.cwd()})"
    if not Path(args.script).is_file():
        reason = "is a directory" if Path(args.script).is_dir() else "not found"
        return f"script {args.script} {reason}"
    return None


def _run_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="traceml run")
    add_run_arguments(parser)
    return parser


def _leading_launcher_options(rest: list[str], parser: argparse.ArgumentParser) -> int:
    """How many tokens at the start of ``rest`` are ``traceml run``'s own options (with values)."""
    takes_value = {
        option: action.nargs != 0
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help", "-m", "--module")  # after the script, -m is the script's
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
