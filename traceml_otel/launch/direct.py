"""The manifest of a direct launch (``python train.py``, ``torchrun``, ``accelerate launch``).

``traceml run`` writes ``manifest.json`` itself. Without it, rank 0 writes one at ``init()`` and
completes it at shutdown, so every run folder has one. A process cannot see its own exit code
from inside (``sys.exit(n)`` leaves no trace at exit), so ``exit_code`` is ``1`` when the script
ended with an uncaught exception (Python's own exit code then), and ``null`` otherwise, with
``end_status`` saying how telemetry shut down.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.sanitize import redact_argv
from traceml_otel.wire.manifest import Manifest


class DirectManifest:
    """Writes and completes ``manifest.json`` for a run that ``traceml run`` did not launch."""

    def __init__(self, run_dir: Path, manifest: Manifest) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self.written = False
        self._clock = time.perf_counter()

    @classmethod
    def start(
        cls, run_dir: Path, *, run_id: str, run_name: str, world_size: int, launcher: str
    ) -> DirectManifest | None:
        """Write the manifest unless one exists (another launch owns the folder); ``None`` then."""
        if (run_dir / c.MANIFEST_FILE).exists():
            return None
        manifest = Manifest(
            run_id=run_id,
            run_name=run_name,
            command=tuple(redact_argv([sys.executable, *sys.argv])),  # no tokens in world-readable files
            launcher=(launcher,),
            written_by="rank 0",
            world_size=world_size,
            start_time=time.time(),
        )  # the end is this plus monotonic time (finish): a wall-clock step moves no duration
        direct = cls(run_dir, manifest)
        direct._write()
        return direct

    def finish(self, status: str) -> None:
        """Record the end: time, how telemetry shut down, and an uncaught exception if there was one."""
        exception = getattr(sys, "last_type", None)  # set by Python for an uncaught exception, before atexit
        end = (self.manifest.start_time or time.time()) + time.perf_counter() - self._clock
        self.manifest = replace(self.manifest, end_time=end, end_status=status)
        if exception is not None and not issubclass(exception, SystemExit):
            self.manifest = replace(self.manifest, exit_code=1, exception_type=exception.__name__)
        elif status.startswith("exit ") and status[5:].isdigit():  # sys.exit(N), N != 0 (process_hooks)
            self.manifest = replace(self.manifest, exit_code=int(status[5:]), exception_type="SystemExit")
        self._write()

    def _write(self) -> None:
        from traceml_otel.launch.launcher import save_manifest  # one writer for both launches; never raises

        save_manifest(self.run_dir, self.manifest)
        self.written = True
