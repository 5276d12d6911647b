"""The offset from this process's ``perf_counter`` to the epoch clock, read so a preemption cannot skew it.

Spans are timed with ``perf_counter_ns()`` (monotonic, cheap) and placed on the epoch clock by one
offset per process, read at ``init()``. Read naively (``time_ns() - perf_counter_ns()``), the offset is
off by however long the process was descheduled between the two reads: on a loaded host that is
milliseconds, which moves every span of the rank against the other ranks and against anything else
timed on the epoch clock. So the wall clock is read between two monotonic reads, a few times, and the
tightest bracket wins: its error is at most half its width (a microsecond or so), whatever the load.
"""

from __future__ import annotations

import time

ANCHOR_READS = 5
"""Bracketed reads per anchor; a preemption spoils one of them, rarely all."""


def wall_anchor_ns(reads: int = ANCHOR_READS) -> int:
    """``time_ns() - perf_counter_ns()`` from the tightest of ``reads`` bracketed reads."""
    perf_counter_ns, time_ns = time.perf_counter_ns, time.time_ns
    best_width, best_anchor = None, 0
    for _ in range(max(1, reads)):
        before = perf_counter_ns()
        wall = time_ns()
        after = perf_counter_ns()
        width = after - before
        if best_width is None or width < best_width:
            best_width, best_anchor = width, wall - (before + after) // 2
    return best_anchor
