"""``rank-R.cpu.json``: the training thread's CPU counters against its step count.

Written by :mod:`traceml_otel.emit.trainer_cpu` (the rank's emitter, every 10 s and at the end,
atomically); read by ``traceml compare`` through :mod:`traceml_otel.analyze.compare_noise` to tell a
busier machine from slower code, and by INPUT_BOUND's advice (:mod:`traceml_otel.analyze.advice`) to
tell computing workers from waiting ones. Each sample is cumulative: ``[steps_closed, monotonic_ns,
thread_on_cpu_ns, thread_cpu_wait_ns, process_cpu_ns, machine_busy_ns, children_cpu_ns,
children_wait_ns]``; ``thread_cpu_wait_ns`` is ``-1`` where the kernel gives no run-queue wait
(``source`` ``stat``), ``machine_busy_ns`` (all CPUs' busy time, ``/proc/stat``) ``-1`` without
``/proc/stat``, ``children_cpu_ns`` and ``children_wait_ns`` (the on-CPU and run-queue wait time of the
trainer's descendant processes but its emitter: DataLoader workers, live, and reaped for the on-CPU
time; read about once a second) ``-1`` in the samples between, where the kernel does not list a
thread's children, and in rows of older records (five or six values).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.wire._json import RecordError, as_int, as_str, read_json_object, write_atomically

CPU_RECORD_VERSION = 1
MAX_CPU_SAMPLES = 4096
MAX_MACHINE_CPUS = 1 << 16
"""Samples read from one file (the sampler keeps at most 2,048)."""


ROW_FIELDS = ("steps", "monotonic_ns", "on_cpu_ns", "cpu_wait_ns", "process_cpu_ns", "machine_busy_ns",
              "children_cpu_ns", "children_wait_ns")
"""A sample's values in order; older records' rows hold the first :data:`OLDEST_ROW_FIELDS` (the rest
read as -1: not measured)."""
OLDEST_ROW_FIELDS = 5


def cpu_file_name(rank: int) -> str:
    """Name of one rank's CPU samples (``rank-R.cpu.json``) inside the run directory."""
    return f"rank-{rank}.cpu.json"


@dataclass(frozen=True, slots=True)
class CpuRecord:
    """One rank's CPU samples: ``(steps, monotonic_ns, on_cpu_ns, cpu_wait_ns, process_cpu_ns,
    machine_busy_ns, children_cpu_ns, children_wait_ns)``."""

    run_id: str
    rank: int
    source: str
    """``schedstat`` (on-CPU and run-queue wait) or ``stat`` (on-CPU in clock ticks, no wait)."""
    samples: tuple[tuple[int, int, int, int, int, int, int, int], ...]
    thinned: int = 0
    """How many times the sampler halved its samples (each time its interval doubled)."""
    machine_cpus: int = 0
    """The machine's CPU count (``os.cpu_count()``), which ``machine_busy_ns`` is out of (0: unknown)."""


def encode_cpu_record(record: CpuRecord) -> str:
    return json.dumps({
        "cpu_record_version": CPU_RECORD_VERSION, "run_id": record.run_id, "rank": record.rank,
        "source": record.source, "thinned": record.thinned, "machine_cpus": record.machine_cpus,
        "samples": [list(s) for s in record.samples],
    }, separators=(",", ":"))


def write_cpu_record(path: Path, record: CpuRecord) -> None:
    """Write the record atomically; raises ``OSError`` (full or read-only disk)."""
    write_atomically(path, encode_cpu_record(record))


def read_cpu_record(path: Path) -> CpuRecord:
    """Read one ``rank-R.cpu.json`` (bounded); raises :class:`RecordError` when malformed.

    Rows that are not five to eight integers, or that go backwards, are left out; missing values are -1."""
    data = read_json_object(path)
    rank = as_int(data.get("rank"))
    version = data.get("cpu_record_version")
    if rank is None or rank < 0 or not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"{path.name}: not a CPU record (no rank or version)")
    raw = data.get("samples")
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []
    for item in raw[:MAX_CPU_SAMPLES] if isinstance(raw, list) else []:
        known = isinstance(item, list) and OLDEST_ROW_FIELDS <= len(item) <= len(ROW_FIELDS)
        values = [as_int(v) for v in item] if known else []
        if not values or any(v is None for v in values):
            continue
        values += [-1] * (len(ROW_FIELDS) - len(values))
        row = tuple(int(v) for v in values if v is not None)
        if rows and (row[0] < rows[-1][0] or row[1] <= rows[-1][1] or row[2] < rows[-1][2]):
            continue
        rows.append(row)  # type: ignore[arg-type]
    return CpuRecord(as_str(data.get("run_id"), 200) or "", rank, as_str(data.get("source"), 20) or "",
                     tuple(rows), max(0, as_int(data.get("thinned")) or 0),
                     min(MAX_MACHINE_CPUS, max(0, as_int(data.get("machine_cpus")) or 0)))
