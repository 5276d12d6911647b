"""What the subcommands share: exit codes, the error line, writing a report, the step-window options.

Exit codes of ``analyze`` and ``compare``: 0 done; 1 nothing to analyse (no usable steps) or, with
``--fail-on-regression``, a regression; 2 bad arguments, unreadable input or an unreachable backend;
3 with ``--fail-on-regression``, an inconclusive comparison (a side without usable data).
``stack render`` exits 0 or 2 (a bad option); ``run`` exits with the script's code, or 2 when it
cannot launch it; argparse exits 2 on an unknown option.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traceml_otel.analyze.run_model import WindowSpec
from traceml_otel.sanitize import strip_control

EXIT_OK, EXIT_NO_DATA, EXIT_ERROR, EXIT_INCONCLUSIVE = 0, 1, 2, 3
EXIT_REGRESSION = EXIT_NO_DATA
"""``compare --fail-on-regression`` on a regression: 1, as ``analyze`` with no usable steps."""


def fail(command: str, message: str) -> int:
    """Print ``traceml COMMAND: error: MESSAGE`` to stderr, as one line without control characters
    (messages quote what servers and files hold); returns ``EXIT_ERROR``."""
    line = " ".join(strip_control(message).split())
    print(f"traceml {command}: error: {line}", file=sys.stderr)
    return EXIT_ERROR


def write_output(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (creating its folder; says so on stderr), or to stdout."""
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"traceml: wrote {output}", file=sys.stderr)


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
    if getattr(args, "step_range", None):
        first, last = args.step_range
        return WindowSpec(first_step=first, last_step=last)
    return WindowSpec(last=getattr(args, "window", None))
