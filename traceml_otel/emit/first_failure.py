"""The launcher's first failure, read by each rank's emitter after its end (``traceml.run.first_failure``).

``traceml run`` writes the rank that failed first, as its parent saw it, into ``manifest.json``
(launch/child_watch.py) before it stops the other ranks. Their emitters, lingering for the last
scrape, read it here and export it, so the stack names a rank killed outright (SIGKILL, the OOM
killer), whose own endpoint went silent, instead of the survivors' collective errors. Read only after
this rank's end, at most once a second, bounded by the manifest reader's size limit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from traceml_otel.wire.manifest import read_manifest

READ_EVERY_S = 1.0


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
