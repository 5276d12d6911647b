"""The frames that carry a training process's records to its emitter, and their checked version.

A frame is a 4-byte big-endian length followed by a compact JSON object with a ``t``
(type) key: ``hello`` (:mod:`traceml_otel.wire.hello`, once, first), ``steps`` (``s``: a batch of
:mod:`traceml_otel.wire.step_row` rows), ``device`` (the CUDA device index and UUID, once known) or
``bye`` (clean shutdown, with the capture side's own drop count and traced steps). JSON, not
pickle: the emitter never evaluates what it reads. ``WIRE_VERSION`` travels in the hello; the
emitter refuses a stream of another version (see :func:`traceml_otel.wire.hello.decode_hello`).

The ``steps`` frame, the only one written per batch on the training thread, is encoded with
``orjson`` where it is installed (a dependency of the training install; not of the analysis-only
one, which never imports it): 1.2 µs per step against 4.5-5.8 µs for ``json.dumps``, the same bytes
for rows of ASCII strings and integers. A row ``orjson`` refuses (an integer beyond 64 bits, a lone
surrogate) falls back to ``json``. Each frame is read by the library that wrote it: the standard
library's frames start with a space (valid JSON whitespace), and only a frame that starts with ``{``
is read with ``orjson`` (which would read an integer beyond 64 bits as a float). Without ``orjson``
on either side, ``json`` writes and reads every frame.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import IO, Any

from traceml_otel.errors import TracemlError

WIRE_VERSION = 2
"""Version of the trainer -> emitter stream: the frames, the hello and the step row layout.

Raised on an incompatible change only. Appending a field to the step row (with a default in
``records.StepRecord``) or to the hello (with a default) keeps the version: both sides ignore
what they do not know and fill in what is missing. Version 2 replaced the untyped hello of
version 1 (whose unread ``argv``, ``run_name`` and ``version`` keys are gone and whose ``traces``
and ``metrics`` pairs became named ``*_endpoint`` and ``*_protocol`` fields).
"""
_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024


class WireError(TracemlError, ValueError):
    """A frame could not be read: the stream is corrupt or was cut."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """Serialise one frame with the standard library (hello, device and bye frames; steps that orjson
    refuses). The leading space tells the reader to read it with the standard library too."""
    body = b" " + json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def encode_steps(rows: list[Any]) -> bytes:
    """Serialise one ``steps`` frame (a batch of step rows; on the training thread)."""
    fast = orjson_module()
    if fast:
        try:
            body = fast.dumps({"t": "steps", "s": rows})
        except TypeError:  # orjson refuses it (an integer beyond 64 bits, a lone surrogate): json takes it
            pass
        else:
            return _HEADER.pack(len(body)) + body
    return encode_frame({"t": "steps", "s": rows})


def decode_body(body: bytes | bytearray) -> Any:
    """One frame's JSON body: orjson's frames (``{`` first) by orjson when installed, others by json."""
    if body[:1] == b"{":
        fast = orjson_module()
        if fast:
            return fast.loads(body)  # orjson.JSONDecodeError is a ValueError, as json's is
    return json.loads(body)


_fast_json: Any = None
"""The ``orjson`` module once looked up (``False`` where it is not installed)."""


def orjson_module() -> Any:
    """``orjson``, imported on first use (the analysis-only install never needs it); None without it."""
    global _fast_json
    if _fast_json is None:
        try:
            import orjson
        except ImportError:
            _fast_json = False
        else:
            _fast_json = orjson
    return _fast_json or None


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
        message = decode_body(body)
        if not isinstance(message, dict) or "t" not in message:
            raise WireError("frame is not a typed message")
        yield message


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
        message = decode_body(self._data[start + _HEADER.size:end])
        if not isinstance(message, dict) or "t" not in message:
            raise WireError("frame is not a typed message")
        return message
