"""The launcher's first failure, read by each rank's emitter after its end (``traceml.run.first_failure``).

``traceml run`` writes the rank that failed first, as its parent saw it, into ``manifest.json``
(launch/child_watch.py) before it stops the other ranks. Their emitters, lingering for the last
scrape, read it here and export it, so the stack names a rank killed outright (SIGKILL, the OOM
killer), whose own endpoint went silent, instead of the survivors' collective errors. Read only after
this rank's end, at most every :data:`READ_EVERY_S`, bounded by the manifest reader's size limit.

A survivor often ends a moment before the launcher has written the failure (its next collective fails
at once; the elastic agent polls its workers). Its end and failed status then reach the stack before
the first failure does, and until a read finds it, the stack can only page for a missing rank, without
naming how it ended: the read is repeated often, so the two reach a scrape together or nearly.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from traceml_otel.wire.manifest import read_manifest

READ_EVERY_S = 0.2
"""A small JSON file, and only after the end: a 1 s period once left a whole short-profile scrape
(1 s) between the end and the first failure, which paged twice (first without the reason)."""


class FirstFailureWatch:
    """``(rank, how)`` of the launcher's first failure once the manifest names one, else ``None``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._found: tuple[int, str] | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> tuple[int, str] | None:
        with self._lock:
            now = time.monotonic()
            if self._found is None and now - self._read_at >= READ_EVERY_S:
                self._read_at = now
                try:
                    manifest = read_manifest(self.run_dir).manifest
                except OSError:
                    manifest = None
                if manifest is not None and manifest.first_failure_rank is not None:
                    self._found = (manifest.first_failure_rank, (manifest.first_failure or "")[:64])
            return self._found
