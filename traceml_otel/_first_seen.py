"""When this process first imported ``traceml_otel``: the earliest moment it can vouch for.

A leaf the package root imports first, so :mod:`traceml_otel.capture.time_ledger` reads the moment
without importing the package root (which loads the training API).
"""

from __future__ import annotations


def _first_seen() -> tuple[float, float | None, bool]:
    """The wall time now, how long this process has run or waited for a CPU since it began
    (``/proc/self/schedstat``) and whether it has waited for a child yet (a shell that ran ``sleep``
    before exec'ing this program; ``/proc/self/stat``): the earliest this interpreter can vouch for
    its own start (``capture/time_ledger.py:own_start_time``). Small reads, once per process."""
    import time

    try:
        with open("/proc/self/schedstat", "rb") as stat:
            run_ns, wait_ns = stat.read().split()[:2]
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        waited = int(fields[8]) + int(fields[13]) + int(fields[14]) > 0  # cminflt, cutime, cstime
        return time.time(), (int(run_ns) + int(wait_ns)) / 1e9, waited
    except (OSError, ValueError, IndexError):
        return time.time(), None, False


FIRST_SEEN = _first_seen()
"""(wall time, seconds running or runnable, waited for a child) when this package was first imported."""
