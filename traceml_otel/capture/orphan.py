"""Ranks stop when ``traceml run`` dies (Linux): the parent-death signal.

``traceml run`` puts its own pid in ``TRACEML_LAUNCHER_PID``. A rank whose parent is that process
asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGTERM)``) for SIGTERM when the parent goes, even on a
SIGKILL of the launcher, so ranks are not orphaned to train on. The SIGTERM reaches our handler,
which flushes telemetry, and the rank then ends as it would on any SIGTERM. Elsewhere this is a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Mapping

from traceml_otel.settings import launcher_pid

_PR_SET_PDEATHSIG = 1


def stop_with_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Arm the parent-death signal when our parent is the ``traceml run`` launcher. True if armed."""
    launcher = launcher_pid(env)
    if launcher is None or not sys.platform.startswith("linux"):
        return False
    if os.getppid() != launcher:
        return False  # not a direct child (e.g. a DataLoader worker's own child): leave it
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != launcher:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return True
