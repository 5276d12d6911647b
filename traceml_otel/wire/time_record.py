"""``rank-R.time.json``: what one rank's process did outside its steps, and its FLOPs.

The training process keeps it (:mod:`traceml_otel.capture.time_ledger`): written at ``init()``,
after an ``outside_step`` block (at most once a second), after a FLOPs measurement and at shutdown,
atomically, never on the per-step path. The analyzer reads it to account for every second from the
process start to its end (:mod:`traceml_otel.analyze.time_accounting`) and for MFU
(:mod:`traceml_otel.analyze.mfu`). Times are Unix seconds (one wall anchor plus monotonic time);
every field may be missing in an old or hand-made file (then ``None``: not recorded, never zero).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_otel.contract import time_file_name
from traceml_otel.wire._json import (
    RecordError,
    as_float,
    as_int,
    as_str,
    as_version,
    read_json_object,
    write_atomically,
)

TIME_RECORD_VERSION = 1
MAX_ATTEMPTS = 64
"""Earlier restarted attempts' starts kept per rank."""
MAX_KINDS = 32
"""``outside_step`` kinds kept per rank; later new kinds are added to ``other``."""


@dataclass(frozen=True, slots=True)
class OutsideTotal:
    """All outermost ``outside_step(kind)`` blocks of one kind on one rank."""

    kind: str
    seconds: float
    count: int
    before_first_step_s: float = 0.0
    """The part spent before the rank's first step began."""
    after_last_step_s: float = 0.0
    """The part spent after the rank's last step ended."""


@dataclass(frozen=True, slots=True)
class FlopsRecord:
    """FLOPs the program declared or had measured, and the peak it declared (``None``: not given)."""

    declared_sum: float | None = None
    """Sum of ``trace_step(flops=)`` over the steps that declared it."""
    declared_steps: int = 0
    per_sample: float | None = None
    per_token: float | None = None
    measured: float | None = None
    """FLOPs counted by ``FlopCounterMode`` in one whole step (every micro-batch in it)."""
    measured_step: int | None = None
    """The step that was measured (its time is slowed by counting; MFU leaves it out)."""
    peak_flops: float | None = None
    """Peak FLOP/s of one rank's device, from ``TRACEML_PEAK_FLOPS``."""
    dtype: str = "bf16"
    device_name: str = ""


@dataclass(frozen=True, slots=True)
class TimeRecord:
    """One rank's ``rank-R.time.json``."""

    rank: int
    run_id: str = ""
    process_start: float | None = None
    """When the process started (from ``/proc``; else when ``traceml_otel`` was imported)."""
    init_at: float | None = None
    written_at: float | None = None
    ended_at: float | None = None
    """When telemetry shut down (``None`` while running, or when the process was killed)."""
    steps: int = 0
    """``trace_step`` blocks completed when written."""
    outside: tuple[OutsideTotal, ...] = ()
    flops: FlopsRecord = FlopsRecord()
    restart: int = 0
    """torchrun's restart count of this attempt (``TORCHELASTIC_RESTART_COUNT``); 0 for the first."""
    launcher_start: float | None = None
    """When the launcher that started the process started (torchrun's or Accelerate's agent: the parent
    process), for a direct launch; ``None`` otherwise."""
    resumed_from: int | None = None
    """``traceml.resume_from(step)``: this attempt resumed from a checkpoint taken after that many
    completed steps; ``None``: not said (a first attempt, or a program that does not say)."""
    earlier_progress: int = 0
    """The furthest step position the earlier attempts of this rank reached (their records, carried
    over at ``init()`` of a restarted attempt): steps from ``resumed_from`` up to it are redone."""
    first_step: int = 0
    """The step number this attempt started at: a restarted attempt goes on numbering after the
    earlier attempts' steps (``steps`` counts them all), so their spans keep distinct trace ids."""
    earlier_after_last_step_s: float = 0.0
    """``outside_step`` time the earlier attempts spent after their last step (their totals are
    carried into ``outside``; this part lies between the attempts)."""
    earlier_restart_starts: tuple[float, ...] = ()
    """The process starts of this rank's earlier restarted attempts (the most recent
    :data:`MAX_ATTEMPTS`), carried over at ``init()``: each restart's gap is billed to ``restarts``."""
    telemetry_s: float = 0.0
    """Telemetry's own time at the end of this process: from the start of its shutdown (the last
    hand-off) to ``ended_at``: the final flush and export, the metrics endpoint's linger. The account
    bills it to ``telemetry``; 0 in a record written before the end."""
    precision: str = ""
    """Reduced precision the program was seen training in: ``autocast cuda bf16`` (an enabled
    ``torch.autocast`` region) or ``bf16 weights`` (a traced model's parameters); empty: none seen."""
    training_tid: int | None = None
    """The training thread's kernel thread id (the thread of the first ``trace_step``), once it ran: the
    emitter reads that thread's CPU counters from ``/proc`` (``rank-R.cpu.json``)."""
    version: int = TIME_RECORD_VERSION


def encode_time_record(record: TimeRecord) -> str:
    """The JSON text of ``record``."""
    flops = record.flops
    return json.dumps({
        "time_record_version": TIME_RECORD_VERSION, "rank": record.rank, "run_id": record.run_id,
        "process_start": record.process_start, "init_at": record.init_at, "written_at": record.written_at,
        "ended_at": record.ended_at, "steps": record.steps, "launcher_start": record.launcher_start,
        "restart": record.restart, "resumed_from": record.resumed_from,
        "earlier_progress": record.earlier_progress, "first_step": record.first_step,
        "earlier_after_last_step_s": record.earlier_after_last_step_s, "telemetry_s": record.telemetry_s,
        "earlier_restart_starts": list(record.earlier_restart_starts), "precision": record.precision,
        "training_tid": record.training_tid,
        "outside": [{"kind": o.kind, "seconds": o.seconds, "count": o.count,
                     "before_first_step_s": o.before_first_step_s, "after_last_step_s": o.after_last_step_s}
                    for o in record.outside],
        "flops": {"declared_sum": flops.declared_sum, "declared_steps": flops.declared_steps,
                  "per_sample": flops.per_sample, "per_token": flops.per_token, "measured": flops.measured,
                  "measured_step": flops.measured_step, "peak_flops": flops.peak_flops, "dtype": flops.dtype,
                  "device_name": flops.device_name},
    }, indent=1) + "\n"


def write_time_record(run_dir: Path, record: TimeRecord) -> None:
    """Write ``rank-R.time.json`` atomically; raises ``OSError`` (full or read-only disk)."""
    write_atomically(Path(run_dir) / time_file_name(record.rank), encode_time_record(record))


def _outside(raw: object) -> OutsideTotal | None:
    if not isinstance(raw, dict):
        return None
    kind, seconds = as_str(raw.get("kind"), 100), as_float(raw.get("seconds"))
    if not kind or seconds is None or seconds < 0:
        return None
    return OutsideTotal(kind, seconds, max(0, as_int(raw.get("count")) or 0),
                        max(0.0, as_float(raw.get("before_first_step_s")) or 0.0),
                        max(0.0, as_float(raw.get("after_last_step_s")) or 0.0))


def _flops(raw: object) -> FlopsRecord:
    if not isinstance(raw, dict):
        return FlopsRecord()
    return FlopsRecord(
        declared_sum=as_float(raw.get("declared_sum")), declared_steps=as_int(raw.get("declared_steps")) or 0,
        per_sample=as_float(raw.get("per_sample")), per_token=as_float(raw.get("per_token")),
        measured=as_float(raw.get("measured")), measured_step=as_int(raw.get("measured_step")),
        peak_flops=as_float(raw.get("peak_flops")), dtype=as_str(raw.get("dtype"), 20) or "bf16",
        device_name=as_str(raw.get("device_name"), 100) or "",
    )


def _starts(raw: object) -> tuple[float, ...]:
    items = raw[-MAX_ATTEMPTS:] if isinstance(raw, list) else []
    return tuple(t for t in (as_float(item) for item in items) if t is not None and t > 0)


def _positive(value: int | None) -> int | None:
    return value if value is not None and 0 < value < 1 << 31 else None


def _non_negative(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


def decode_time_record(data: dict[str, Any]) -> TimeRecord:
    """The record in a decoded ``rank-R.time.json``.

    Raises:
        RecordError: it names no rank.
    """
    rank = as_int(data.get("rank"))
    if rank is None or rank < 0:
        raise RecordError("no rank in the time record")
    raw_outside = data.get("outside")
    items = raw_outside[:MAX_KINDS + 1] if isinstance(raw_outside, list) else []
    outside = [_outside(item) for item in items]
    return TimeRecord(
        rank=rank, run_id=as_str(data.get("run_id")) or "", process_start=as_float(data.get("process_start")),
        init_at=as_float(data.get("init_at")), written_at=as_float(data.get("written_at")),
        ended_at=as_float(data.get("ended_at")), steps=max(0, as_int(data.get("steps")) or 0),
        outside=tuple(o for o in outside if o is not None), flops=_flops(data.get("flops")),
        launcher_start=as_float(data.get("launcher_start")), restart=max(0, as_int(data.get("restart")) or 0),
        resumed_from=_non_negative(as_int(data.get("resumed_from"))),
        earlier_progress=max(0, as_int(data.get("earlier_progress")) or 0),
        first_step=max(0, as_int(data.get("first_step")) or 0),
        earlier_after_last_step_s=max(0.0, as_float(data.get("earlier_after_last_step_s")) or 0.0),
        telemetry_s=max(0.0, as_float(data.get("telemetry_s")) or 0.0),
        earlier_restart_starts=_starts(data.get("earlier_restart_starts")),
        precision=as_str(data.get("precision"), 40) or "",
        training_tid=_positive(as_int(data.get("training_tid"))),
        version=as_version(data.get("time_record_version")) or 1,
    )


def read_time_record(path: Path) -> TimeRecord:
    """Read one ``rank-R.time.json`` (bounded by the record read limit).

    Raises:
        RecordError: unreadable or not JSON (a ``ValueError``); ValueError: no rank in it.
    """
    return decode_time_record(read_json_object(path))
