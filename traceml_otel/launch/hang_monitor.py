"""The launcher's hang monitor: one stderr line when ranks hang, one when they resume.

``traceml run`` starts it beside the job. Once a second it looks at the run folder's
``rank-R.hang.json`` records (re-reading only the files whose size or time changed), combines the
ones still ``hung`` into one verdict (:mod:`traceml_otel.wire.hang_verdict`) and prints it once. It waits
up to :data:`GATHER_S` after the first record for the other ranks' records, so the line names the
waiting ranks too. With ``--hang-action terminate`` it then ends the job (the launcher exits with
:data:`EXIT_HANG`) once every rank of the world has written its record, or the gather time passed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from traceml_otel.contract import hang_file_name, hang_traceback_file_name, rank_of_file
from traceml_otel.sanitize import one_line, strip_control
from traceml_otel.wire.hang_record import SOURCE_FAULTHANDLER, STATE_HUNG, HangRecord, read_hang_record
from traceml_otel.wire.hang_verdict import HangVerdict, combine, faulthandler_record, hang_file_names

HANG_ACTIONS = ("report", "terminate")
EXIT_HANG = 75
"""``traceml run --hang-action terminate`` exits with this code after ending a hung job."""
GATHER_S = 5.0
"""After the first rank reports a hang, how long to wait for the other ranks' records."""
POLL_S = 1.0


class HangMonitor:
    """Watches one run folder for hang records from a daemon thread; see the module docstring."""

    def __init__(self, run_dir: Path, world_size: int, action: str = "report",
                 terminate: Callable[[], None] | None = None, poll_s: float = POLL_S) -> None:
        if action not in HANG_ACTIONS:
            raise ValueError(f"hang action must be one of {', '.join(HANG_ACTIONS)}, not {action!r}")
        self.run_dir = Path(run_dir)
        self.world_size = world_size
        self.action = action
        self.terminate = terminate or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.poll_s = poll_s
        self.reported: HangVerdict | None = None
        self.terminated = False
        self._records: dict[int, HangRecord] = {}
        self._seen: dict[str, tuple[int, int]] = {}
        self._first_hung_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traceml-hang-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as error:  # the monitor must never take the launcher down
                print(f"traceml: hang monitor stopped: {type(error).__name__}: {error}",
                      file=sys.stderr, flush=True)
                return

    def _read(self) -> None:
        """Read the hang files that appeared or changed since the last poll (one listing, a stat each).

        A rank's ``rank-R.hang.json`` wins over its ``faulthandler`` dump.
        """
        try:
            names = hang_file_names(self.run_dir)
        except OSError:
            return
        for name in names:
            try:
                stat = os.stat(self.run_dir / name, follow_symlinks=False)
            except OSError:
                continue
            key = (stat.st_mtime_ns, stat.st_size)
            if self._seen.get(name) == key:
                continue
            self._seen[name] = key
            rank = rank_of_file(name, hang_file_name)
            if rank is not None:
                try:
                    self._records[rank] = read_hang_record(self.run_dir / name)
                except ValueError:  # RecordError included: a record being replaced is read next time
                    self._seen.pop(name, None)
                continue
            rank = rank_of_file(name, hang_traceback_file_name)
            known = self._records.get(rank) if rank is not None else None
            if rank is not None and (known is None or known.source == SOURCE_FAULTHANDLER):
                dumped = faulthandler_record(self.run_dir / name, rank)
                if dumped is not None:
                    self._records[rank] = dumped

    def poll(self) -> None:
        """Read new records and print what changed (called once a second by the thread)."""
        self._read()
        hung = [r for r in self._records.values() if r.state == STATE_HUNG]
        now = time.monotonic()
        if not hung:
            if self.reported is not None:
                print("traceml: hang resolved: every rank is making progress again",
                      file=sys.stderr, flush=True)
                self.reported = None
            self._first_hung_at = None
            return
        if self._first_hung_at is None:
            self._first_hung_at = now
        everyone = len(hung) >= self.world_size
        if self.reported is None and (everyone or now - self._first_hung_at >= GATHER_S):
            verdict = combine(hung, self.world_size)
            if verdict is None:
                return
            self.reported = verdict
            print(f"traceml: HANG: {strip_control(verdict.sentence)}", file=sys.stderr, flush=True)
            print(f"traceml: stacks of every thread: {one_line(self.run_dir)}/rank-R.hang.json; "
                  "`traceml analyze` shows the verdict after the run", file=sys.stderr, flush=True)
        if self.reported is not None and self.action == "terminate" and not self.terminated:
            if everyone or now - self._first_hung_at >= 2 * GATHER_S:
                self.terminated = True
                print(f"traceml: --hang-action terminate: ending the job (exit code {EXIT_HANG})",
                      file=sys.stderr, flush=True)
                self.terminate()
