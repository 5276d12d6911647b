"""Python stacks of this process's children (DataLoader workers) when a hang is seen in input fetch.

A DataLoader worker is a forked child; its stack cannot be read from the parent. At fork, each
child of a traced process registers ``faulthandler`` on :data:`DUMP_SIGNAL` to write every thread's
stack into an anonymous in-memory file (``memfd``, nothing on disk). When the parent's watchdog
sees the training thread stalled in input fetch, it sends that signal to its children that have
the file open, then reads their dumps through ``/proc/PID/fd``. Linux only; elsewhere (or when
``memfd`` is unavailable) there are simply no worker stacks. ``SIGURG`` is used because its
default action is to be ignored: a child that did not register is not harmed by it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from pathlib import Path

from traceml_otel.wire.hang_record import ThreadStack, parse_faulthandler

DUMP_SIGNAL = signal.SIGURG
MEMFD_NAME = "traceml-stacks"
MAX_CHILDREN = 8
MAX_DUMP_BYTES = 256 * 1024


def arm_in_child() -> None:
    """In a freshly forked child: dump stacks into a memfd on :data:`DUMP_SIGNAL` (best effort)."""
    try:
        fd = os.memfd_create(MEMFD_NAME, 0)
        faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    except (AttributeError, OSError, RuntimeError, ValueError):
        pass


def _children() -> list[int]:
    pids: list[int] = []
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                text = Path(task.path, "children").read_text()
            except OSError:
                continue
            pids += [int(p) for p in text.split() if p.isdigit()]
    except OSError:
        return []
    return sorted(set(pids))[:64]


def _dump_fd(pid: int) -> str | None:
    try:
        for entry in os.scandir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(entry.path).startswith(f"/memfd:{MEMFD_NAME}"):
                    return entry.path
            except OSError:
                continue
    except OSError:
        return None
    return None


def child_stacks(wait_s: float = 0.3) -> tuple[ThreadStack, ...]:
    """Every armed child's threads (names start with ``child PID``); empty when none could be read."""
    armed = [(pid, path) for pid in _children() if (path := _dump_fd(pid)) is not None][:MAX_CHILDREN]
    for pid, _ in armed:
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError:
            pass
    if not armed:
        return ()
    time.sleep(wait_s)
    stacks: list[ThreadStack] = []
    for pid, path in armed:
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - MAX_DUMP_BYTES))
                text = handle.read(MAX_DUMP_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        stacks += parse_faulthandler(text, name_prefix=f"child {pid} ")
    return tuple(stacks)
