"""The training side of the pipe to the emitter process.

``EmitterChannel`` starts ``python -m traceml_otel.emit.worker`` with a pipe on its
stdin and hands it batches of step rows. Writes never block the training thread: the
pipe is non-blocking, what does not fit waits in a bounded backlog and goes out with
the next batch, and what overflows the backlog is counted as dropped and reported.
"""

from __future__ import annotations

import collections
import fcntl
import os
import subprocess
import sys
import time
from typing import Any

from traceml_otel.emit.wire import WIRE_VERSION, StepRow, encode_frame

_F_SETPIPE_SZ = 1031  # Linux: grow the pipe so a batch rarely waits in the backlog
PIPE_BYTES = 1 << 20
BACKLOG_LIMIT_BYTES = 64 << 20


class EmitterChannel:
    """Owns the emitter process and the write end of its pipe.

    ``send_steps`` runs on the training thread: it must not block or raise.
    """

    def __init__(self, hello: dict[str, Any], *, command: list[str] | None = None) -> None:
        read_fd, write_fd = os.pipe()
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # a smaller pipe only means more use of the backlog
        os.set_blocking(write_fd, False)
        self._process = subprocess.Popen(
            command or [sys.executable, "-m", "traceml_otel.emit.worker"],
            stdin=read_fd,
            close_fds=True,
        )
        os.close(read_fd)
        self._fd: int | None = write_fd
        self._backlog: collections.deque[tuple[memoryview, int]] = collections.deque()
        self._backlog_bytes = 0
        self.dropped_steps = 0
        self.broken: str | None = None
        self._enqueue(encode_frame({"t": "hello", "v": WIRE_VERSION, **hello}), steps=0)

    def send_steps(self, rows: list[StepRow]) -> None:
        """Queue a batch of completed steps and push as much as the pipe takes."""
        if self.broken is not None or self._fd is None:
            self.dropped_steps += len(rows)
            return
        self._enqueue(encode_frame({"t": "steps", "s": rows}), steps=len(rows))

    def send_device(self, index: int, uuid: str | None) -> None:
        """Tell the emitter the CUDA device this rank uses (for the per-rank info series)."""
        if self.broken is None and self._fd is not None:
            self._enqueue(encode_frame({"t": "device", "index": index, "uuid": uuid}), steps=0)

    def close(self, timeout_s: float, status: str = "ok") -> bool:
        """Send the goodbye, drain the backlog, and wait for the emitter to finish.

        Returns False when the emitter was still busy (e.g. OTLP retries) at the deadline;
        it then finishes on its own, and the local copy is already complete.
        """
        deadline = time.monotonic() + timeout_s
        if self._fd is not None and self.broken is None:
            self._enqueue(encode_frame({"t": "bye", "status": status, "dropped": self.dropped_steps}), 0)
            while self._backlog and self.broken is None and time.monotonic() < deadline:
                time.sleep(0.005)
                self._push()
            self._drop_backlog()
        self.detach()
        try:
            self._process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def detach(self) -> None:
        """Close our end of the pipe (after fork in a child, or at shutdown)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _enqueue(self, frame: bytes, steps: int) -> None:
        if self._backlog_bytes + len(frame) > BACKLOG_LIMIT_BYTES:
            self.dropped_steps += steps
            return
        self._backlog.append((memoryview(frame), steps))
        self._backlog_bytes += len(frame)
        self._push()

    def _push(self) -> None:
        while self._backlog and self._fd is not None:
            chunk, steps = self._backlog[0]
            try:
                written = os.write(self._fd, chunk)
            except BlockingIOError:
                return
            except OSError as error:  # the emitter died: count everything from here on
                self.broken = f"emitter pipe closed ({error.strerror})"
                self._drop_backlog()
                return
            self._backlog_bytes -= written
            if written == len(chunk):
                self._backlog.popleft()
            else:
                self._backlog[0] = (chunk[written:], steps)

    def _drop_backlog(self) -> None:
        self.dropped_steps += sum(steps for _, steps in self._backlog)
        self._backlog.clear()
        self._backlog_bytes = 0
