"""The training thread's CPU use, read from another thread: whether a quiet spell is work or a stall.

On Linux the thread's ``/proc/self/task/<tid>/schedstat`` gives the time it spent on a CPU and the
time it waited, runnable, for one (a busy thread on a loaded machine, beside DataLoader workers or
other jobs, waits for a CPU much of the time and is still working: the analyzer counts both too,
``analyze/busy_gaps.py``). Elsewhere ``time.pthread_getcpuclockid`` gives the on-CPU time alone. Both
are read from the hang watchdog's thread (one small read, nothing on the training thread), at each
step it sees and again when no step has come for a while: a thread that spent most of that time on or
waiting for a CPU between steps is working (an evaluation no ``outside_step`` marks); one that sleeps,
blocks on I/O or waits in a collective is not. Where neither is readable every reading is ``None`` and
nothing is told apart.
"""

from __future__ import annotations

import os
import threading
import time


class ThreadCpuClock:
    """Seconds one thread (``threading.get_ident()`` of it) spent on or waiting for a CPU, or ``None``."""

    def __init__(self) -> None:
        self._ident: int | None = None
        self._schedstat: str | None = None
        self._clock: int | None = None

    def read(self, ident: int | None) -> float | None:
        """The seconds thread ``ident`` has been on a CPU or runnable waiting for one so far (on-CPU
        seconds only where ``/proc`` does not tell; ``None``: no thread, or nothing readable)."""
        if ident is None:
            return None
        if ident != self._ident:
            self._ident, self._schedstat, self._clock = ident, _schedstat_path(ident), None
        if self._schedstat is not None:
            try:
                with open(self._schedstat, "rb") as stat:
                    on_cpu, waited = stat.read(128).split()[:2]
                return (int(on_cpu) + int(waited)) * 1e-9
            except (OSError, ValueError):
                self._schedstat = None  # the on-CPU clock from now on
        try:
            if self._clock is None:
                self._clock = time.pthread_getcpuclockid(ident)
            return time.clock_gettime(self._clock)
        except (AttributeError, OSError, OverflowError, ValueError):
            return None


def _schedstat_path(ident: int) -> str | None:
    """``/proc/self/task/<native id>/schedstat`` of the live thread ``ident`` (``None``: not found)."""
    for thread in threading.enumerate():
        if thread.ident == ident and thread.native_id is not None:
            path = f"/proc/self/task/{thread.native_id}/schedstat"
            return path if os.path.exists(path) else None
    return None
