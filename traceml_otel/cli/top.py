"""``traceml top RUN_DIR``: the live view of a run folder, from another terminal, over ssh, or afterwards.

It reads the ranks' ``rank-R.live.json`` records (a multi-node job on a shared filesystem included) and
needs no service. On a terminal it redraws the panel every second until every rank has ended or ``q``
(or Ctrl-C) is pressed; a finished run is shown once (its last window: a replay of where it ended).
``--once`` prints one panel, ``--lines`` one ``traceml-live`` line per refresh (see README.md, "Watching
a run"). ``--prometheus URL`` reads the same view from a Prometheus server (``cli/top_prometheus.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import select
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from traceml_otel.cli.common import EXIT_ERROR
from traceml_otel.report.live_view import LiveFolder, LiveSnapshot, live_line, snapshot


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml top``."""
    parser.add_argument("run_dir", nargs="?", type=Path, help="the run folder (traceml-runs/RUN_ID)")
    parser.add_argument("--once", action="store_true", help="print the view once and exit")
    parser.add_argument("--lines", action="store_true",
                        help="one traceml-live line per refresh instead of the panel")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--prometheus", metavar="URL", help="read the view from this Prometheus server")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--job", help="with --prometheus: the job (traceml_job label)")
    group.add_argument("--run-id", help="with --prometheus: the run id (traceml_run_id label)")
    parser.add_argument("-k", type=int, default=5, help="slowest and fastest ranks shown (default 5)")


def run_top(args: argparse.Namespace) -> int:
    """Run ``traceml top``; 0 when it ended normally, 2 on a usage error."""
    if args.prometheus:
        from traceml_otel.cli.top_prometheus import run_top_prometheus

        return run_top_prometheus(args)
    if args.run_dir is None:
        print("traceml top: error: give a run folder, or --prometheus URL with --job or --run-id",
              file=sys.stderr)
        return EXIT_ERROR
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"traceml top: error: {run_dir} is not a folder", file=sys.stderr)
        return EXIT_ERROR
    folder = LiveFolder(run_dir)
    interval = max(0.2, float(args.interval))
    if not folder.read():
        if args.once:
            print(f"traceml top: {run_dir} holds no live records (rank-R.live.json) yet", file=sys.stderr)
            return 1
    tty = sys.stdout.isatty()
    if args.lines or (not tty and not args.once and not _finished(folder)):
        return _lines(folder, interval, once=args.once)  # a log: one line per refresh until the end
    return _panel(folder, run_dir, interval, once=args.once or not tty, k=args.k)


def _finished(folder: LiveFolder) -> bool:
    records = folder.read()
    return bool(records) and all(r.ended for r in records.values())


def _lines(folder: LiveFolder, interval: float, once: bool) -> int:
    while True:
        snap = snapshot(folder.read(), frozen_since=folder.frozen_since)
        print(live_line(snap), flush=True)
        if once or snap.ended:
            return 0
        time.sleep(interval)


@contextlib.contextmanager
def _keys() -> Iterator[bool]:
    """stdin in cbreak mode (a key press reads at once) while the panel runs; False when not a terminal."""
    try:
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        yield False
        return
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(wait_s: float, keys: bool, on_capture: Callable[[], None] | None = None) -> bool:
    """Wait ``wait_s``; True when ``q`` was pressed. ``c`` asks for a deep capture (``on_capture``)."""
    if not keys:
        time.sleep(wait_s)
        return False
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sys.stdin], [], [], left)[0]:
            key = sys.stdin.read(1)
            if key in ("q", "Q"):
                return True
            if key in ("c", "C") and on_capture is not None:
                on_capture()
    return False


def _panel(folder: LiveFolder, run_dir: Path, interval: float, once: bool, k: int) -> int:
    from rich.console import Console
    from rich.live import Live

    from traceml_otel.launch.live_panel import render_panel

    console = Console()

    def view() -> tuple[LiveSnapshot, object]:
        snap = snapshot(folder.read(), k=k, frozen_since=folder.frozen_since)
        return snap, render_panel(snap, str(run_dir))

    snap, panel = view()
    if once or snap.ended:
        console.print(panel)
        return 0
    with _keys() as keys, Live(panel, console=console, auto_refresh=False) as live:  # type: ignore[arg-type]
        while not _quit_pressed(interval, keys, lambda: _ask_capture(run_dir)):
            try:
                snap, panel = view()
                live.update(panel, refresh=True)  # type: ignore[arg-type]
            except Exception as error:  # keep refreshing whatever one read did
                print(f"traceml top: {type(error).__name__}: {error}", file=sys.stderr)
            if snap.ended:
                break
    return 0


def _ask_capture(run_dir: Path) -> None:
    """The ``c`` key: every rank of the run takes a deep capture of its next steps (``docs/captures.md``)."""
    from traceml_otel.cli.capture import ask_capture

    try:
        ask_capture(run_dir)
    except OSError as error:
        print(f"traceml top: no capture asked: {error}", file=sys.stderr)
