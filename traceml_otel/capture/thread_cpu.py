"""The training thread's CPU time, read from another thread: whether a quiet spell is work or a stall.

``time.pthread_getcpuclockid`` gives the thread's CPU clock and ``time.clock_gettime`` reads it (one
system call, no file, nothing on the training thread). The hang watchdog reads it at each step it sees
and again when no step has come for a while: a thread that spent most of that time on a CPU between
steps is working (an evaluation no ``outside_step`` marks), one that sleeps, blocks on I/O or waits in
a collective is not. Where the clock is missing (not POSIX) every reading is ``None`` and nothing is
told apart.
"""

from __future__ import annotations

import time


class ThreadCpuClock:
    """CPU seconds of one thread (``threading.get_ident()`` of it), or ``None`` when unreadable."""

    def __init__(self) -> None:
        self._ident: int | None = None
        self._clock: int | None = None

    def read(self, ident: int | None) -> float | None:
        """The CPU seconds thread ``ident`` has used so far (``None``: no thread, or no clock here)."""
        if ident is None:
            return None
        try:
            if ident != self._ident:
                self._clock, self._ident = time.pthread_getcpuclockid(ident), ident
            return time.clock_gettime(self._clock) if self._clock is not None else None
        except (AttributeError, OSError, OverflowError, ValueError):
            self._clock = None
            return None
