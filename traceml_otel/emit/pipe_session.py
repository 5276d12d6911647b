"""The emitter's side of the trainer's pipe: frames in, the local report out, and version refusal.

:class:`PipeSession` reads frames without blocking and hands steps to the :class:`Emitter` at once
(the local copy is written as they arrive); export and metrics run only while the pipe is idle.
At the goodbye, or at end of stream (the trainer died), it closes the local copy, reports what it
holds on stdout (:class:`~traceml_otel.wire.control.LocalReport`), then drains export.
:func:`refuse_stream` answers a trainer of another wire version: its steps are read, counted as
dropped and reported, never used.
"""

from __future__ import annotations

import gc
import os
import select
import sys
import threading
import time
from typing import Any

from traceml_otel.emit.emitter import Emitter
from traceml_otel.wire.control import (
    BYE,
    DEVICE,
    LocalReport,
    decode_bye,
    decode_device,
    encode_local_report,
)
from traceml_otel.wire.frames import WIRE_VERSION, FrameBuffer, WireError
from traceml_otel.wire.hello import Hello, WireVersionError, decode_hello

READ_CHUNK = 1 << 20
GC_THRESHOLDS = (20_000, 10, 10)
"""The emitter's garbage collector: a young collection every 20,000 allocations net (Python's default,
700, ran one every ~130 steps' records, each promoting a frame's records still waiting for export)."""


def freeze_heap() -> None:
    """Keep what is alive now (the OTel SDK, gRPC, the analyzer: hundreds of thousands of objects that
    live as long as the process) out of the garbage collector's scans (``gc.freeze``): a full
    collection, triggered by the steps' records, scanned them all (25 ms, in a real run about 10 us
    a step of 0.4 ms). Done once the emitter has started and again at the first steps, after the
    imports of its first idle moments; nothing frozen is freed, and nothing is lost by that but the
    little garbage of those imports."""
    gc.freeze()


def report(message: LocalReport) -> None:
    """One JSON line to the trainer on our stdout (it may be gone; that is fine)."""
    try:
        os.write(1, encode_local_report(message))
    except OSError:
        pass


class PipeSession:
    """Reads the trainer's frames; the local copy first, export when the pipe is idle."""

    def __init__(self, fd: int, buffer: FrameBuffer, hello: Hello, own_process: bool = False) -> None:
        self.fd = fd
        self.buffer = buffer
        self.hello = hello
        self.emitter: Emitter | None = None
        self.eof = False
        self.done = False
        self.own_process = own_process
        """The emitter process's own session: it sets its garbage collector (:func:`freeze_heap`)."""
        self.steps_seen = not own_process
        self.started = time.monotonic()

    def start(self) -> None:
        if self.emitter is None:
            self.emitter = Emitter(self.hello)
            if self.own_process:
                gc.set_threshold(*GC_THRESHOLDS)
                freeze_heap()

    def run(self, stop: threading.Event | None = None) -> None:
        """Work until the trainer's goodbye or end of stream, or until ``stop`` is set."""
        self.start()
        emitter = self.emitter
        assert emitter is not None
        while not self.done:
            if stop is not None and stop.is_set():
                return
            try:
                frame = self.buffer.next_frame()
            except (WireError, ValueError) as error:
                self._broken(str(error))
                return
            if emitter.cpu is not None:
                emitter.cpu.tick()
            if frame is not None:
                self._handle(frame)
                continue
            if self.eof:
                if self.buffer.pending_bytes:
                    emitter.stats.problems.append("stream from trainer ended inside a frame")
                self._end("trainer exited without shutdown (killed?)", 0, False, None)
                return
            idle = not select.select([self.fd], [], [], 0)[0]
            if idle:
                emitter.poll_hang()
            if idle and emitter.has_export_work and (stop is None or not stop.is_set()):
                emitter.export_next()
                continue
            wait = 0.25 if emitter.cpu is None else min(0.25, emitter.cpu.due_in())
            if idle and not select.select([self.fd], [], [], wait)[0]:
                emitter.refresh_stats()
                continue
            data = os.read(self.fd, READ_CHUNK)
            if data:
                self.buffer.feed(data)
            else:
                self.eof = True

    def _broken(self, error: str) -> None:
        assert self.emitter is not None
        self.emitter.stats.problems.append(
            f"stream from trainer broken after {time.monotonic() - self.started:.1f}s: {error}")
        self._end("stream from trainer broken", 0, False, None)

    def _handle(self, frame: dict[str, Any]) -> None:
        assert self.emitter is not None
        kind = frame.get("t")
        if kind == "steps":
            if not self.steps_seen:
                self.steps_seen = True
                freeze_heap()  # the imports of the first idle moments (the live summary's analyzer)
            self.emitter.handle_steps(frame["s"])
        elif kind == DEVICE:
            try:
                self.emitter.handle_device(decode_device(frame))
            except WireError as error:
                self.emitter.stats.problems.append(f"device frame ignored: {error}")
        elif kind == BYE:
            try:
                bye = decode_bye(frame)
            except WireError as error:
                self._broken(str(error))
                return
            self._end(bye.status, bye.dropped, True, bye.traced)

    def _end(self, status: str, dropped: int, clean: bool, traced: int | None) -> None:
        assert self.emitter is not None
        self.emitter.poll_hang(force=True)  # a hang recorded since the last idle poll still gets its span
        report(self.emitter.finish_local(status, dropped, clean, traced))
        if self.emitter.cpu is not None:
            self.emitter.cpu.close()  # after the trainer's answer: its last sample costs it no wait
        self.emitter.finish_export()
        self.done = True


def read_hello(fd: int, buffer: FrameBuffer) -> Hello | None:
    """The first frame, checked (:func:`decode_hello` raises on another version); None at end of stream."""
    while True:
        frame = buffer.next_frame()
        if frame is not None:
            return decode_hello(frame)
        data = os.read(fd, READ_CHUNK)
        if not data:
            return None
        buffer.feed(data)


def refuse_stream(fd: int, buffer: FrameBuffer, error: WireVersionError) -> None:
    """A trainer of another wire version: say so once, read its frames to the end without using
    them (it never blocks on us), and report how many steps were dropped, for its own account."""
    rank = "?" if error.rank is None else error.rank
    print(f"traceml: rank {rank}: {error}; this rank's steps are dropped (no spans, local copy or "
          f"metrics): install the same traceml-otel for the training script and its emitter",
          file=sys.stderr, flush=True)
    dropped, traced = 0, None
    try:
        while True:
            frame = buffer.next_frame()
            if frame is None:
                data = os.read(fd, READ_CHUNK)
                if not data:
                    break
                buffer.feed(data)
            elif frame.get("t") == "steps" and isinstance(frame.get("s"), list):
                dropped += len(frame["s"])
            elif frame.get("t") == BYE:
                traced = decode_bye(frame).traced
                break
    except (WireError, ValueError, OSError):
        pass  # a stream we cannot read further: what was counted is reported
    reason = f"wire version mismatch (trainer {error.sent!r}, emitter {WIRE_VERSION})"
    report(LocalReport(rank=error.rank, enabled=False, steps=0, traced=traced, complete=False,
                       disabled={"emitter": reason}, refused=reason, dropped=dropped))
