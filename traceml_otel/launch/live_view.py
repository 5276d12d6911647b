"""``traceml run --live``: the launcher's live view, beside the job, on a daemon thread.

Every second it reads the run folder's ``rank-R.live.json`` records (:class:`~traceml_otel.report.
live_view.LiveFolder`) and folds them into a snapshot.

- ``lines``: one ``traceml-live key=value ...`` line on stdout every ``interval_s`` (logs, CI).
- ``panel``: a ``rich`` Live panel pinned at the bottom of the terminal. The ranks are the launcher's
  children and write to the same terminal, and a panel redrawn under output it does not know about
  would be torn by it. So while the panel is up, the launcher's own fds 1 and 2 point at one
  pseudo-terminal (:class:`TerminalProxy`) that every rank inherits: the script still sees a terminal
  (``isatty``, line buffering, colours), its stdout and stderr stay in the one order it wrote them, and
  the launcher copies each complete line, unchanged but for cursor-moving escape sequences, above the
  panel (rich's ``Live`` prints there). A line still being written (a ``\\r`` progress bar) is shown
  live just above the panel until it ends. At the end the fds go back, the panel is removed, and one
  final summary line stays above the diagnosis.

The view never stops refreshing: reading or drawing failing once is said on one line and the view goes
on; a rank that stops writing its record shows as not reporting (``report/live_view.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_otel.sanitize import strip_control

if TYPE_CHECKING:
    from traceml_otel.report.live_view import LiveFolder, LiveSnapshot

LIVE_MODES = ("auto", "panel", "lines", "off")
REFRESH_S = 1.0
MAX_PENDING = 4096
"""Characters of an unfinished output line kept for the live display (the line itself is never cut)."""


def resolve_mode(mode: str, stream: Any = None) -> str:
    """``auto`` -> ``panel`` when stdout is a terminal, else ``lines``; other modes as given."""
    if mode != "auto":
        return mode
    stream = sys.stdout if stream is None else stream
    try:
        return "panel" if stream.isatty() and os.environ.get("TERM", "") != "dumb" else "lines"
    except (AttributeError, ValueError):
        return "lines"


class TerminalProxy:
    """Points fds 1 and 2 at a pseudo-terminal and hands what arrives to ``on_text`` (see module doc)."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(1, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        sys.stdout.flush()
        sys.stderr.flush()
        self.real_out, self.real_err = os.dup(1), os.dup(2)
        os.set_inheritable(self.real_out, False)
        os.set_inheritable(self.real_err, False)
        self.terminal = os.fdopen(os.dup(self.real_out), "w", encoding="utf-8", errors="replace",
                                  buffering=1)
        os.dup2(slave, 1)
        os.dup2(slave, 2)
        os.close(slave)
        self.on_text: Callable[[str], None] = self._raw
        self._thread = threading.Thread(target=self._pump, name="traceml-live-output", daemon=True)
        self._thread.start()

    def _raw(self, text: str) -> None:
        self.terminal.write(text)
        self.terminal.flush()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer is gone
                return
            if not data:
                return
            try:
                self.on_text(data.decode("utf-8", "replace"))
            except Exception:  # the output is the user's: it must keep flowing whatever the panel does
                with contextlib.suppress(Exception):
                    self._raw(data.decode("utf-8", "replace"))

    def restore(self) -> None:
        """fds 1 and 2 back to the terminal; output already in the pseudo-terminal is still copied (what the
        ranks' helpers write later, too, until this process exits)."""
        sys.stdout.flush()
        sys.stderr.flush()
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and select.select([self.master], [], [], 0.05)[0]:
            time.sleep(0.05)  # let the pump copy what is queued
        self.on_text = self._raw
        os.dup2(self.real_out, 1)
        os.dup2(self.real_err, 2)


class LineSplitter:
    """Complete lines out, the unfinished one kept (``\\r\\n`` -> ``\\n``; after ``\\r``, the newest text)."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, text: str) -> str:
        text = (self.pending + text).replace("\r\n", "\n")
        done, newline, rest = text.rpartition("\n")
        self.pending = rest
        lines = [line.rpartition("\r")[2] for line in done.split("\n")] if newline else []
        return "\n".join(lines) + ("\n" if newline else "")

    @property
    def current(self) -> str:
        return self.pending.rpartition("\r")[2][-MAX_PENDING:]


class LiveView:
    """The launcher's live view of one run folder (see the module docstring)."""

    def __init__(self, run_dir: Path, run_id: str, mode: str, interval_s: float = 30.0,
                 refresh_s: float = REFRESH_S) -> None:
        self.folder: LiveFolder | None = None
        self.run_id = run_id
        self.run_dir = run_dir
        self.mode = resolve_mode(mode)
        self.interval_s = interval_s
        self.refresh_s = refresh_s
        self.last: LiveSnapshot | None = None
        self.refreshes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traceml-live-view", daemon=True)
        self._live: Any = None
        self._proxy: TerminalProxy | None = None
        self._split = LineSplitter()
        self._lock = threading.Lock()
        self._complained = False
        self._panel: tuple[LiveSnapshot, Any] | None = None

    def start(self) -> None:
        if self.mode == "off":
            return
        if self.mode == "panel":
            try:
                self._start_panel()
            except Exception as error:  # no terminal to draw on: the lines still work
                self._say(f"live panel unavailable ({type(error).__name__}: {error}); live lines instead")
                self.mode = "lines"
        self._thread.start()

    def _start_panel(self) -> None:
        from rich.console import Console
        from rich.live import Live

        proxy = TerminalProxy()
        try:
            console = Console(file=proxy.terminal, force_terminal=True)
            live = Live(console=console, auto_refresh=False, transient=True, redirect_stdout=False,
                        redirect_stderr=False)
            live.start()
        except BaseException:
            proxy.restore()  # the ranks write to the terminal itself again
            raise
        self._proxy, self._live = proxy, live
        proxy.on_text = self._output

    def _output(self, text: str) -> None:
        """The ranks' output: complete lines above the panel, the unfinished one just over it."""
        from rich.text import Text

        with self._lock:
            before = self._split.current
            done = self._split.feed(text)
            if done:  # printing above a Live display redraws it too
                self._live.console.print(Text.from_ansi(done.rstrip("\n")), soft_wrap=True, highlight=False)
            if self._split.current != before:
                self._draw()

    def _draw(self) -> None:
        from rich.console import Group
        from rich.text import Text

        from traceml_otel.launch.live_panel import render_panel

        parts: list[Any] = []
        if self._split.current:
            parts.append(Text.from_ansi(self._split.current))
        if self.last is not None:
            if self._panel is None or self._panel[0] is not self.last:
                self._panel = (self.last, render_panel(self.last))  # built once per refresh
            parts.append(self._panel[1])
        else:
            parts.append(Text(f"traceml live: waiting for the ranks' first reports in {self.run_dir}",
                              style="dim"))
        self._live.update(Group(*parts), refresh=True)

    def _run(self) -> None:
        next_line = time.monotonic() + self.interval_s
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
                if self.mode == "lines" and time.monotonic() >= next_line:
                    next_line += self.interval_s
                    self._print_line()
            except Exception as error:  # say it once; keep refreshing
                if not self._complained:
                    self._complained = True
                    self._say(f"live view: {type(error).__name__}: {error}; it keeps trying")

    def refresh(self) -> LiveSnapshot:
        """Read the records and redraw (the panel) or just keep the snapshot (lines).

        The analyzer's modules are imported here, on the view's thread, at the first refresh: the
        launcher starts the job without waiting for them."""
        from traceml_otel.report.live_view import LiveFolder, snapshot

        if self.folder is None:
            self.folder = LiveFolder(self.run_dir, self.run_id)
        snap = snapshot(self.folder.read(), frozen_since=self.folder.frozen_since)
        self.last = snap
        self.refreshes += 1
        if self._live is not None:
            with self._lock:
                self._draw()
        return snap

    def _print_line(self) -> None:
        from traceml_otel.report.live_view import live_line

        if self.last is not None and self.last.ranks_seen:
            sys.stdout.write(live_line(self.last) + "\n")
            sys.stdout.flush()

    def stop(self) -> None:
        """Stop refreshing; the panel gives way to one summary line (the diagnosis follows)."""
        if self.mode == "off":
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if self._live is not None:
            with contextlib.suppress(Exception):
                self.refresh()
            proxy = self._proxy
            assert proxy is not None
            proxy.restore()
            with self._lock:
                rest = self._split.pending
                self._split.pending = ""
                with contextlib.suppress(Exception):
                    self._live.stop()
                if rest:
                    proxy.terminal.write(strip_control(rest) + "\n")
            from traceml_otel.report.live_view import flag_sentences, live_line

            last = self.last
            summary = [live_line(last), *flag_sentences(last)] if last and last.ranks_seen else []
            for line in summary:
                proxy.terminal.write(line + "\n")
            proxy.terminal.flush()

    def _say(self, message: str) -> None:
        print(f"traceml: {strip_control(message)}", file=sys.stderr, flush=True)


def announce() -> None:
    """The job's start line (``launch/start_line.py``) from the launcher, with the ranks' settings."""
    from traceml_otel.errors import SettingsError
    from traceml_otel.launch.start_line import print_start_line
    from traceml_otel.settings import load_settings

    try:
        settings = load_settings()
    except (SettingsError, ValueError):
        return  # the ranks say what is wrong with their settings
    print_start_line(settings)


def start_live_view(run_dir: Path, run_id: str, mode: str, interval_s: float) -> LiveView:
    """Start the view (``off``: a view that does nothing)."""
    view = LiveView(run_dir, run_id, mode, interval_s)
    view.start()
    return view
