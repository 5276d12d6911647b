"""``rank-R.export.json`` on disk: the emitter's counts, rewritten atomically and at a bounded rate.

Each write replaces the file through a temporary one (:func:`traceml_otel.wire._json.write_atomically`,
which refuses planted links) and reserves ``STATS_RESERVED_BYTES`` of disk beyond its end, so that
when a full disk refuses a new file the final counts can still overwrite the old one in place. A
failure is said once and never stops the emitter.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from traceml_otel.wire._json import write_atomically
from traceml_otel.wire.export_stats import ExportStats, encode_export_stats

STATS_RESERVED_BYTES = 8192
STATS_INTERVAL_S = 1.0
"""The file is rewritten at most this often while steps arrive (one 8 KiB write), so a dead or
stopped emitter leaves counts at most this old."""


class StatsFile:
    """Writes one rank's :class:`ExportStats` to ``path`` (None: no run folder, nothing written)."""

    def __init__(self, path: Path | None, on_failure: Callable[[str], None]) -> None:
        self.path = path
        self.failed = False
        self._on_failure = on_failure
        self._written = 0.0
        self._dirty = False

    def mark_dirty(self) -> None:
        """Counts moved since the last write."""
        self._dirty = True

    def refresh(self, stats: ExportStats) -> None:
        """Write when counts moved since the last write, at most every ``STATS_INTERVAL_S``."""
        if self._dirty and time.monotonic() - self._written >= STATS_INTERVAL_S:
            self.write(stats)

    def write(self, stats: ExportStats) -> None:
        """Replace the file now; on failure, overwrite the old one in place, else turn off (said once)."""
        if self.path is None or self.failed:
            return
        self._written, self._dirty = time.monotonic(), False
        text = encode_export_stats(stats)
        try:
            write_atomically(self.path, text, reserve_bytes=STATS_RESERVED_BYTES)
        except OSError as error:
            if not self._overwrite(text.encode()):
                self.failed = True
                self._on_failure(f"cannot write {self.path} ({type(error).__name__}: {error})")

    def _overwrite(self, data: bytes) -> bool:
        """Write over the existing file without allocating (a full disk); False when that fails too."""
        assert self.path is not None
        try:
            flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)  # a FIFO there never blocks
            fd = os.open(self.path, flags)
        except OSError:
            return False
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                return False
            if len(data) > max(status.st_size, status.st_blocks * 512):  # only blocks already held
                return False
            if os.pwrite(fd, data, 0) != len(data):
                return False
            os.ftruncate(fd, len(data))
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
