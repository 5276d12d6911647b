"""What the subcommands share: exit codes, the error line, writing a report, the step-window options.

Exit codes of ``analyze`` and ``compare``: 0 done; 1 nothing to analyse (no usable steps) or, with
``--fail-on-regression``, a regression; 2 bad arguments, unreadable input or an unreachable backend;
3 with ``--fail-on-regression``, an inconclusive comparison (a side without usable data).
``stack render`` exits 0 or 2 (a bad option); ``run`` exits with the script's code, or 2 when it
cannot launch it; argparse exits 2 on an unknown option.

Every command: 2 and ``traceml CMD: error: MESSAGE`` for a user's error (a
:class:`~traceml_otel.errors.TracemlError` or an ``OSError``: input, configuration, a file, a
backend); 70 (``EX_SOFTWARE``) and ``traceml CMD: internal error`` with the traceback for any other
exception, which is a bug in traceml-otel, never reported as bad input.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_otel.errors import TracemlError
from traceml_otel.sanitize import one_line, strip_control

if TYPE_CHECKING:  # the analyzer is imported by the commands that use it, not by `traceml run`'s launcher
    from traceml_otel.analyze.run_model import WindowSpec

EXIT_OK, EXIT_NO_DATA, EXIT_ERROR, EXIT_INCONCLUSIVE = 0, 1, 2, 3
EXIT_REGRESSION = EXIT_NO_DATA
"""``compare --fail-on-regression`` on a regression: 1, as ``analyze`` with no usable steps."""
EXIT_INTERNAL = 70
"""A bug in traceml-otel (an exception that is not a user's error): ``EX_SOFTWARE`` of sysexits.h."""


def fail(command: str, error: str | BaseException) -> int:
    """Print ``traceml COMMAND: error: MESSAGE`` to stderr without control characters; returns
    ``EXIT_ERROR``. The message is one line (messages quote what servers and files hold), unless the
    error is a :class:`TracemlError` whose ``multiline`` says its lines are our own."""
    text = strip_control(str(error))
    if not getattr(error, "multiline", False):
        text = " ".join(text.split())
    print(f"traceml {command}: error: {text}", file=sys.stderr)
    return EXIT_ERROR


def internal_error(command: str) -> int:
    """Say that the exception being handled is a bug in traceml-otel, with its traceback; returns
    ``EXIT_INTERNAL``."""
    print(f"traceml {command}: internal error: this is a bug in traceml-otel, not in your input; please "
          "report it with the traceback below", file=sys.stderr)
    print(strip_control(traceback.format_exc()), end="", file=sys.stderr)
    return EXIT_INTERNAL


def run_command(command: str, body: Callable[[], int]) -> int:
    """``body()``, with a user's error (:class:`TracemlError`, ``OSError``) as exit 2 and one line, and
    any other exception as an internal error (exit 70 and the traceback)."""
    try:
        return body()
    except (TracemlError, OSError) as error:
        return fail(command, error)
    except Exception:
        return internal_error(command)


def write_output(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (creating its folder; says so on stderr), or to stdout."""
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"traceml: wrote {one_line(output)}", file=sys.stderr)


def add_format_aliases(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """``--json``/``--html``: short for ``--format json``/``--format html`` (the same spelling everywhere)."""
    for name in formats:
        parser.add_argument(f"--{name}", dest="format", action="store_const", const=name,
                            help=f"same as --format {name}")


def _step_range(text: str) -> tuple[int | None, int | None]:
    low, sep, high = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("use FIRST:LAST, e.g. 100:200, :200 or 100:")
    try:
        return (int(low) if low else None, int(high) if high else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a step range: {text!r}") from None


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """``--window N`` or ``--step-range FIRST:LAST`` (one of them)."""
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--window", type=int, metavar="N", help="analyse only the last N aligned steps")
    window.add_argument(
        "--step-range", type=_step_range, metavar="FIRST:LAST", help="analyse a range of step numbers"
    )


def window_spec(args: argparse.Namespace) -> WindowSpec:
    """The analysis window the window options describe."""
    from traceml_otel.analyze.run_model import WindowSpec

    if getattr(args, "step_range", None):
        first, last = args.step_range
        return WindowSpec(first_step=first, last_step=last)
    return WindowSpec(last=getattr(args, "window", None))
