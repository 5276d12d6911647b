"""The training side of the pipe to the emitter process.

``EmitterChannel`` starts ``python -m traceml_otel.emit.worker`` with a pipe on its
stdin and hands it batches of step rows. Writes never block the training thread: the
pipe is non-blocking, what does not fit waits in a bounded backlog and goes out with
the next batch, and what overflows the backlog is counted as dropped and reported.

At shutdown the local copy comes first: the channel tells the emitter to hurry (a byte on a
second pipe; the emitter then works at the trainer's priority instead of nice 10), hands over
the whole backlog for as long as the emitter keeps taking it, and waits for the emitter's
report of what the local copy holds. Only OTLP export is bounded by ``timeout_s``; the local
copy is given up only when the emitter takes nothing for ``MIN_STALL_S`` (or ``timeout_s`` if
longer): a hung disk, or an emitter that died.
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

from traceml_otel.wire.control import (
    Bye,
    DeviceInfo,
    LocalReport,
    decode_local_report,
    encode_bye,
    encode_device,
)
from traceml_otel.wire.frames import encode_steps
from traceml_otel.wire.hello import Hello, encode_hello
from traceml_otel.wire.step_row import StepRow

_F_SETPIPE_SZ = 1031  # Linux: grow the pipe so a batch rarely waits in the backlog
PIPE_BYTES = 1 << 20
BACKLOG_LIMIT_BYTES = 64 << 20
MIN_STALL_S = 30.0
"""How long shutdown waits for an emitter that takes nothing (it may still be starting)."""


class EmitterChannel:
    """Owns the emitter process and the write end of its pipe.

    ``send_steps`` runs on the training thread: it must not block or raise.
    """

    def __init__(self, hello: Hello, *, command: list[str] | None = None) -> None:
        read_fd, write_fd = os.pipe()
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # a smaller pipe only means more use of the backlog
        os.set_blocking(write_fd, False)
        hurry_read, hurry_write = os.pipe()
        self._process = subprocess.Popen(
            command or [sys.executable, "-m", "traceml_otel.emit.worker", "--hurry-fd", str(hurry_read)],
            stdin=read_fd,
            stdout=subprocess.PIPE,
            close_fds=True,
            pass_fds=(hurry_read,),
        )
        os.close(read_fd)
        os.close(hurry_read)
        self._fd: int | None = write_fd
        self._hurry_fd: int | None = hurry_write
        self._backlog: collections.deque[tuple[memoryview, int]] = collections.deque()
        self._backlog_bytes = 0
        self.steps_offered = 0
        self.steps_handed = 0
        """Steps written whole into the pipe (the emitter may not have read them all)."""
        self.dropped_steps = 0
        self.broken: str | None = None
        self.local_report: LocalReport | None = None
        """The emitter's word on the local copy at shutdown: steps written, complete or not."""
        self._enqueue(encode_hello(hello), steps=0)

    def send_steps(self, rows: list[StepRow]) -> None:
        """Queue a batch of completed steps and push as much as the pipe takes."""
        self.steps_offered += len(rows)
        if self.broken is not None or self._fd is None:
            self.dropped_steps += len(rows)
            return
        self._enqueue(encode_steps(rows), steps=len(rows))

    def send_device(self, index: int, uuid: str | None) -> None:
        """Tell the emitter the CUDA device this rank uses (for the per-rank info series)."""
        if self.broken is None and self._fd is not None:
            self._enqueue(encode_device(DeviceInfo(index, uuid)), steps=0)

    def close(
        self, timeout_s: float, status: str = "ok", traced: int | None = None, stall_s: float = MIN_STALL_S
    ) -> bool:
        """Send the goodbye, hand over the whole backlog, and wait for the emitter.

        ``traced`` is the number of steps the trainer closed; the emitter compares it with what
        it wrote. Returns False when the emitter was still busy (OTLP export) ``timeout_s`` after
        the local copy was done; it then finishes on its own. ``local_report`` holds what the
        emitter said about the local copy (None when it said nothing; :meth:`emitter_fate` then
        says why). ``stall_s``: how long an emitter may take nothing before it is given up.
        """
        stall_s = max(timeout_s, stall_s)
        self._hurry()
        if self._fd is not None and self.broken is None:
            self._enqueue(encode_bye(Bye(status, self.dropped_steps, traced)), 0)
            self._drain_backlog(stall_s)
            if self._backlog:
                self.broken = self.broken or f"emitter made no progress for {stall_s:g} s at shutdown"
            self._drop_backlog()
            if self.broken is None:
                self._wait_for_local_report(stall_s)
        self.detach()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        finally:
            self._read_reports(0.0)
        return True

    def emitter_fate(self) -> str:
        """How the emitter ended, in words (for a rank whose emitter did not report back)."""
        code = self._process.poll()
        if code is None:
            return "stopped responding (took nothing at shutdown; stopped or hung?)"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"died (killed by {name})"
        return f"exited with code {code}" if code else "exited"

    def detach(self) -> None:
        """Close our ends of the pipes (after fork in a child, or at shutdown)."""
        for name in ("_fd", "_hurry_fd"):
            fd = getattr(self, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)

    def _hurry(self) -> None:
        """Tell the emitter the trainer is shutting down (it raises its priority for the rest)."""
        if self._hurry_fd is not None:
            try:
                os.write(self._hurry_fd, b"!")
            except OSError:
                pass

    def _drain_backlog(self, stall_s: float) -> None:
        last_progress = time.monotonic()
        while self._backlog and self.broken is None and self._fd is not None:
            before = self._backlog_bytes
            self._push()
            now = time.monotonic()
            if self._backlog_bytes != before:
                last_progress = now
            elif now - last_progress > stall_s or self._process.poll() is not None:
                return
            if self._backlog:
                select.select([], [self._fd], [], 0.05)

    def _wait_for_local_report(self, stall_s: float) -> None:
        """Wait until the emitter reports its local copy closed, while it still reads the pipe."""
        last_progress, unread = time.monotonic(), _unread_bytes(self._fd)
        while self.local_report is None and self._process.poll() is None:
            self._read_reports(0.05)
            now, still_unread = time.monotonic(), _unread_bytes(self._fd)
            if still_unread != unread:
                last_progress, unread = now, still_unread
            elif now - last_progress > stall_s:
                return

    def _read_reports(self, wait_s: float) -> None:
        stdout = self._process.stdout
        if stdout is None:
            return
        try:
            if not select.select([stdout], [], [], wait_s)[0]:
                return
            data = os.read(stdout.fileno(), 1 << 16)
        except (OSError, ValueError):
            return
        for line in data.splitlines():
            report = decode_local_report(line)
            if report is None:
                continue
            self.local_report = report
            if report.refused:  # the emitter read our steps without using them: they are lost, and counted
                self.broken = f"the emitter refused the stream: {report.refused}"
                self.dropped_steps += max(0, report.dropped)

    def _enqueue(self, frame: bytes, steps: int) -> None:
        if self._backlog_bytes + len(frame) > BACKLOG_LIMIT_BYTES:
            self.dropped_steps += steps
            return
        self._backlog.append((memoryview(frame), steps))
        self._backlog_bytes += len(frame)
        self._push()

    def _push(self) -> None:
        if not self._backlog or self._fd is None:
            return
        # A SIGTERM/Ctrl-C handler that flushes must never run between a write and its bookkeeping:
        # it would write the same bytes again and corrupt the stream. Hold those signals back for the
        # few microseconds of the writes (two syscalls per batch, not per step).
        held = _hold_signals()
        try:
            self._push_held()
        finally:
            _release_signals(held)

    def _push_held(self) -> None:
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
                self.steps_handed += steps
            else:
                self._backlog[0] = (chunk[written:], steps)

    def _drop_backlog(self) -> None:
        self.dropped_steps += sum(steps for _, steps in self._backlog)
        self._backlog.clear()
        self._backlog_bytes = 0


_HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _hold_signals() -> set[signal.Signals] | None:
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    except (AttributeError, OSError, ValueError):
        return None


def _release_signals(previous: set[signal.Signals] | None) -> None:
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _unread_bytes(fd: int | None) -> int | None:
    """Bytes in the pipe the emitter has not read yet (None where the OS cannot say)."""
    if fd is None:
        return None
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return None
