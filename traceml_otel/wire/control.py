"""The control traffic between a training process and its emitter, beside the hello and the steps.

Trainer -> emitter, as frames (:mod:`traceml_otel.wire.frames`):

- :class:`DeviceInfo` (``t`` = ``device``): the CUDA device the rank uses, once CUDA is up;
- :class:`Bye` (``t`` = ``bye``): the clean goodbye, with the capture side's own drop count and the
  number of steps it closed.

Emitter -> trainer, as one JSON line on the emitter's stdout:

- :class:`LocalReport` (``t`` = ``local``): what the local copy holds once it is closed, or why the
  emitter refused the stream. The trainer states completeness from it, never from hope.

Every record is encoded and decoded from its own dataclass fields, so the two sides cannot name a
field differently; a field of the wrong type is a :class:`~traceml_otel.wire.frames.WireError`, a
missing one takes its default (appending a field with a default keeps ``WIRE_VERSION``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from traceml_otel.wire.fields import decode_fields
from traceml_otel.wire.frames import WireError, encode_frame

DEVICE = "device"
BYE = "bye"
LOCAL = "local"

_INT = (int,)
_TEXT = (str,)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The CUDA device of one rank (for the per-rank info series)."""

    index: int
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Bye:
    """The trainer's goodbye: how it ended and what the capture side counted."""

    status: str = "ok"
    """``ok``, ``exception X`` or the signal's name."""
    dropped: int = 0
    """Steps the capture side could not hand over (backlog full, emitter pipe closed)."""
    traced: int | None = None
    """Steps the trainer closed; the emitter compares it with what it wrote."""


@dataclass(frozen=True, slots=True)
class LocalReport:
    """The emitter's word on the local copy once it is closed (or on a stream it refused)."""

    rank: int | None
    enabled: bool
    """The local copy was on to the end (not turned off by a fault, and a run folder was given)."""
    steps: int
    """Steps written to the local copy."""
    traced: int | None = None
    """The trainer's own count (from the goodbye), when it said goodbye."""
    complete: bool | None = None
    """Every traced step is in the local copy (None: not known)."""
    disabled: dict[str, str] = field(default_factory=dict)
    """Outputs turned off, with the reason."""
    refused: str | None = None
    """Why the emitter refused the whole stream (another wire version); its steps were dropped."""
    dropped: int = 0
    """Steps the emitter read without using them (a refused stream)."""


_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    DeviceInfo: {"index": _INT, "uuid": _TEXT},
    Bye: {"status": _TEXT, "dropped": _INT, "traced": _INT},
    LocalReport: {"rank": _INT, "enabled": (bool,), "steps": _INT, "traced": _INT, "complete": (bool,),
                  "disabled": (dict,), "refused": _TEXT, "dropped": _INT},
}
"""What each field may hold on the wire (None as well, where the field's default is None)."""
_KINDS: dict[type, str] = {DeviceInfo: DEVICE, Bye: BYE, LocalReport: LOCAL}

Record = TypeVar("Record", DeviceInfo, Bye, LocalReport)


def _body(record: DeviceInfo | Bye | LocalReport) -> dict[str, Any]:
    body: dict[str, Any] = {"t": _KINDS[type(record)]}
    body.update((spec.name, getattr(record, spec.name)) for spec in fields(record))
    return body


def _decode(kind: type[Record], message: Any) -> Record:
    """The record of ``kind`` in ``message``, checked field by field (unknown keys are ignored)."""
    name = _KINDS[kind]
    if not isinstance(message, dict) or message.get("t") != name:
        raise WireError(f"not a {name} message")
    values = decode_fields(kind, message, _TYPES[kind], f"{name} message")
    return kind(**values)


def encode_device(device: DeviceInfo) -> bytes:
    """The device frame."""
    return encode_frame(_body(device))


def encode_bye(bye: Bye) -> bytes:
    """The goodbye frame."""
    return encode_frame(_body(bye))


def decode_device(frame: Any) -> DeviceInfo:
    """The device in a ``device`` frame. Raises :class:`WireError` when it is malformed."""
    device = _decode(DeviceInfo, frame)
    return DeviceInfo(device.index, device.uuid[:128] if device.uuid else None)


def decode_bye(frame: Any) -> Bye:
    """The goodbye in a ``bye`` frame. Raises :class:`WireError` when it is malformed."""
    return _decode(Bye, frame)


def encode_local_report(report: LocalReport) -> bytes:
    """One JSON line (with its newline) for the emitter's stdout."""
    return (json.dumps(_body(report)) + "\n").encode()


def decode_local_report(line: bytes | str) -> LocalReport | None:
    """The report in one stdout line; None for a line that is not one (the trainer ignores it)."""
    try:
        message = json.loads(line)
        return _decode(LocalReport, message)
    except (ValueError, WireError):
        return None
