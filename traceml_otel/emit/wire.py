"""The frames that carry completed steps from a training process to its emitter.

A frame is a 4-byte big-endian length followed by a compact JSON object with a ``t``
(type) key: ``hello`` (settings and clock anchor, once), ``steps`` (a batch of step
rows), ``device`` (the CUDA device index and UUID, once known) or ``bye`` (clean
shutdown, with the capture side's own drop count). JSON, not
pickle: the emitter never evaluates what it reads.

A step row is a flat list (cheap to build on the training thread); ``decode_step``
turns it into a :class:`~traceml_otel.records.StepRecord` on the emitter side.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import IO, Any

from traceml_otel.records import CollectiveTiming, LoaderSettings, PhaseTiming, StepRecord

WIRE_VERSION = 1
_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024

StepRow = list[Any]
"""``[step, start, end, gpu_dur, wait, wait_gpu, fetches, prefetch_h2d, optimizer_steps,
parallelism, peak_alloc, peak_reserved, device_total, exception_type, phases, collectives, samples,
tokens, loader]`` with phases as ``[phase, call, start, end, gpu_offset, gpu_dur, nbytes]``,
collectives as ``[kind, source, start, end, nbytes, blocking, gpu_offset, gpu_dur]`` and loader
``None`` or ``[num_workers, pin_memory, persistent_workers, prefetch_factor, batch_size]``; times
are ``perf_counter_ns`` readings of the training process. Fields are only ever appended, so a
row from an older capture side (shorter) still decodes."""

_APPENDED_DEFAULTS = ((), None, None, None)
"""Values of the appended fields (collectives, samples, tokens, loader) a shorter row lacks."""


class WireError(ValueError):
    """A frame could not be read: the stream is corrupt or was cut."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """Serialise one frame."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def read_frames(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Yield frames until end of stream. A cut final frame raises :class:`WireError`."""
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise WireError("stream ended inside a frame header")
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise WireError(f"frame of {length} bytes is larger than allowed")
        body = stream.read(length)
        if len(body) < length:
            raise WireError("stream ended inside a frame")
        message = json.loads(body)
        if not isinstance(message, dict) or "t" not in message:
            raise WireError("frame is not a typed message")
        yield message


def decode_step(row: StepRow, anchor_ns: int) -> StepRecord:
    """Turn a step row into a record, moving CPU readings onto the epoch clock."""
    (step, start, end, gpu_dur, wait, wait_gpu, fetches, prefetch, opt_steps,
     parallelism, alloc, reserved, total, exc, phase_rows) = row[:15]
    tail = row[15:19]
    collective_rows, samples, tokens, loader = (*tail, *_APPENDED_DEFAULTS[len(tail):])
    phases = tuple(
        PhaseTiming(
            phase=p[0], call=p[1], start_ns=p[2] + anchor_ns, end_ns=p[3] + anchor_ns,
            gpu_offset_ns=p[4], gpu_duration_ns=p[5], nbytes=p[6],
        )
        for p in phase_rows
    )
    collectives = tuple(
        CollectiveTiming(
            kind=k[0], source=k[1], start_ns=k[2] + anchor_ns,
            end_ns=None if k[3] is None else k[3] + anchor_ns, nbytes=k[4], blocking=bool(k[5]),
            gpu_offset_ns=k[6], gpu_duration_ns=k[7],
        )
        for k in collective_rows
    )
    return StepRecord(
        step=step, start_ns=start + anchor_ns, end_ns=end + anchor_ns, phases=phases,
        gpu_duration_ns=gpu_dur, input_wait_ns=wait, input_wait_gpu_ns=wait_gpu,
        input_fetches=fetches, prefetch_h2d_ns=prefetch, optimizer_steps=opt_steps,
        parallelism=parallelism, peak_allocated_bytes=alloc, peak_reserved_bytes=reserved,
        device_total_bytes=total, exception_type=exc, collectives=collectives, samples=samples,
        tokens=tokens, loader=LoaderSettings(*loader) if loader else None,
    )


class FrameBuffer:
    """Frames out of bytes that arrive in pieces (the emitter reads its pipe without blocking).

    ``feed`` appends what was read; ``next_frame`` returns one complete frame, or ``None``
    while the next one is still incomplete.
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._position = 0

    def feed(self, data: bytes) -> None:
        if self._position:
            del self._data[:self._position]
            self._position = 0
        self._data += data

    @property
    def pending_bytes(self) -> int:
        """Bytes read but not yet returned as frames (a cut frame at end of stream)."""
        return len(self._data) - self._position

    def next_frame(self) -> dict[str, Any] | None:
        start = self._position
        if len(self._data) - start < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(self._data, start)
        if length > MAX_FRAME_BYTES:
            raise WireError(f"frame of {length} bytes is larger than allowed")
        end = start + _HEADER.size + length
        if len(self._data) < end:
            return None
        self._position = end
        message = json.loads(self._data[start + _HEADER.size:end])
        if not isinstance(message, dict) or "t" not in message:
            raise WireError("frame is not a typed message")
        return message
