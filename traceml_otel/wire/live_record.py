"""One rank's live window summary: ``rank-R.live.json``, rewritten atomically about once a second.

The rank's emitter keeps the last :data:`WINDOW_STEPS` steps and publishes what the live view needs:
progress (steps done, the last step's wall time), the window's step time (median, p95, min, max), its
per-step means on the analyzer's own terms (``window``: the fields of
:class:`~traceml_otel.analyze.findings.RankMetrics`, so the viewer runs the analyzer's rules on them),
throughput, goodput and MFU so far, CUDA memory, drops, the trainer process's state and the rank's
hang record. ``seq`` rises with every write and ``written_at`` is the writer's wall time: a reader
tells a silent rank by a record that stops aging forward. The record is bounded (a few KiB): lists are
cut at :data:`MAX_LIST` items and strings at :data:`MAX_TEXT` characters.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceml_otel.wire._json import (
    RecordError,
    as_float,
    as_int,
    as_str,
    as_version,
    read_json_object,
    write_atomically,
)

LIVE_RECORD_VERSION = 1
WINDOW_STEPS = 100
"""Steps in a rank's live window (the last ones it completed)."""
MAX_LIST = 16
MAX_TEXT = 200
MAX_LIVE_BYTES = 64 << 10
"""A live record larger than this is not read (they are 2-4 KiB)."""

TRAINER_RUNNING = "running"
TRAINER_STOPPED = "stopped"
"""The trainer process is stopped (SIGSTOP, a debugger): it cannot report."""
TRAINER_GONE = "gone"
TRAINER_UNKNOWN = "unknown"


def live_file_name(rank: int) -> str:
    """Name of one rank's live record inside the run directory."""
    return f"rank-{rank}.live.json"


@dataclass(frozen=True, slots=True)
class OutsideKind:
    """Time in one ``outside_step`` kind so far (evaluation, checkpoint, ...)."""

    kind: str
    seconds: float
    count: int


@dataclass(frozen=True, slots=True)
class LiveHang:
    """The rank's hang record as the live view shows it (``state`` ``none`` when there is none)."""

    state: str = "none"
    stalled_s: float = 0.0
    phase: str = ""
    location: str = ""
    """``file:line`` of the program's frame the rank is stuck in."""
    code: str = ""
    collective: str = ""


@dataclass(frozen=True, slots=True)
class LiveRecord:
    """One rank's live summary (see the module docstring)."""

    run_id: str
    rank: int
    seq: int
    written_at: float
    """Wall time (Unix seconds) of this write."""
    local_rank: int = 0
    world_size: int = 1
    host: str = ""
    trainer_pid: int = 0
    trainer_state: str = TRAINER_UNKNOWN
    ended: bool = False
    end_status: str = ""
    steps: int = 0
    """Steps this rank completed so far (received by its emitter)."""
    last_step: int | None = None
    last_step_at: float | None = None
    """Wall time the last step ended."""
    started_at: float | None = None
    """Wall time the trainer process started (goodput's denominator counts from it)."""
    window_steps: int = 0
    clock: str = "cpu"
    parallelism: str = "none"
    step_median_s: float | None = None
    step_p95_s: float | None = None
    step_min_s: float | None = None
    step_max_s: float | None = None
    steps_per_s: float | None = None
    """Steps per second of wall time over the window (first start to last end)."""
    window: dict[str, float | None] = field(default_factory=dict)
    """Per-step means over the window, named as ``RankMetrics``' fields (seconds, counts)."""
    goodput: float | None = None
    """Time in steps (input wait included) over wall time since the process started."""
    mfu: float | None = None
    outside: tuple[OutsideKind, ...] = ()
    cuda_peak_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_total_bytes: int | None = None
    dropped: int = 0
    """Steps or spans lost so far (capture drops, spans not delivered or skipped), by the rank's account."""
    degraded: tuple[str, ...] = ()
    """Outputs turned off, one short reason each."""
    hang: LiveHang = LiveHang()
    version: int = LIVE_RECORD_VERSION


def encode_live_record(record: LiveRecord) -> str:
    """The record as compact JSON (bounded: lists and texts cut)."""
    data = asdict(record)
    data["outside"] = data["outside"][:MAX_LIST]
    data["degraded"] = [text[:MAX_TEXT] for text in data["degraded"][:MAX_LIST]]
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def write_live_record(run_dir: Path, record: LiveRecord) -> None:
    """Replace ``rank-R.live.json`` atomically (a reader sees the old or the new record, never half).

    Raises:
        OSError: the folder is read-only or full, or a link sits at the path.
    """
    write_atomically(run_dir / live_file_name(record.rank), encode_live_record(record))


def _text(raw: object) -> str:
    return as_str(raw, MAX_TEXT) or ""


def _window(raw: object) -> dict[str, float | None]:
    if not isinstance(raw, dict):
        return {}
    return {str(k)[:64]: as_float(v) for k, v in list(raw.items())[:64]}


def _outside(raw: object) -> tuple[OutsideKind, ...]:
    if not isinstance(raw, list):
        return ()
    kinds = []
    for item in raw[:MAX_LIST]:
        if isinstance(item, dict):
            kinds.append(OutsideKind(_text(item.get("kind")), as_float(item.get("seconds")) or 0.0,
                                     as_int(item.get("count")) or 0))
    return tuple(kinds)


def _hang(raw: object) -> LiveHang:
    if not isinstance(raw, dict):
        return LiveHang()
    return LiveHang(_text(raw.get("state")) or "none", as_float(raw.get("stalled_s")) or 0.0,
                    _text(raw.get("phase")), _text(raw.get("location")), _text(raw.get("code")),
                    _text(raw.get("collective")))


def decode_live_record(data: dict[str, Any]) -> LiveRecord:
    """A :class:`LiveRecord` from its JSON object; raises :class:`RecordError` when it is not one."""
    version = as_version(data.get("version"))
    if version != LIVE_RECORD_VERSION:
        raise RecordError(f"live record version {data.get('version')!r}, "
                          f"this reader reads {LIVE_RECORD_VERSION}")
    rank, seq, written = as_int(data.get("rank")), as_int(data.get("seq")), as_float(data.get("written_at"))
    if rank is None or rank < 0 or seq is None or written is None:
        raise RecordError("live record without rank, seq or written_at")
    degraded = data.get("degraded")
    return LiveRecord(
        run_id=_text(data.get("run_id")), rank=rank, seq=seq, written_at=written,
        local_rank=as_int(data.get("local_rank")) or 0,
        world_size=max(1, as_int(data.get("world_size")) or 1),
        host=_text(data.get("host")), trainer_pid=as_int(data.get("trainer_pid")) or 0,
        trainer_state=_text(data.get("trainer_state")) or TRAINER_UNKNOWN,
        ended=data.get("ended") is True, end_status=_text(data.get("end_status")),
        steps=max(0, as_int(data.get("steps")) or 0), last_step=as_int(data.get("last_step")),
        last_step_at=as_float(data.get("last_step_at")), started_at=as_float(data.get("started_at")),
        window_steps=max(0, as_int(data.get("window_steps")) or 0),
        clock=_text(data.get("clock")) or "cpu", parallelism=_text(data.get("parallelism")) or "none",
        step_median_s=as_float(data.get("step_median_s")), step_p95_s=as_float(data.get("step_p95_s")),
        step_min_s=as_float(data.get("step_min_s")), step_max_s=as_float(data.get("step_max_s")),
        steps_per_s=as_float(data.get("steps_per_s")), window=_window(data.get("window")),
        goodput=as_float(data.get("goodput")), mfu=as_float(data.get("mfu")),
        outside=_outside(data.get("outside")),
        cuda_peak_bytes=as_int(data.get("cuda_peak_bytes")),
        cuda_reserved_bytes=as_int(data.get("cuda_reserved_bytes")),
        cuda_total_bytes=as_int(data.get("cuda_total_bytes")),
        dropped=max(0, as_int(data.get("dropped")) or 0),
        degraded=tuple(_text(t) for t in degraded[:MAX_LIST]) if isinstance(degraded, list) else (),
        hang=_hang(data.get("hang")),
    )


def read_live_record(path: Path) -> LiveRecord:
    """Read one ``rank-R.live.json`` (bounded; never follows a link); raises :class:`RecordError`."""
    return decode_live_record(read_json_object(path, MAX_LIVE_BYTES))
