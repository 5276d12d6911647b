"""Write the step table (``rank-R.steps.csv``): one row per step, from the spans the emitter just built.

Runs in the emitter process, after the local copy's write of the same batch, never on the training
thread. A row holds what the span reader folds out of the step's spans (see
:mod:`traceml_otel.wire.step_table`); a test holds the two equal field for field. Cost, measured
by ``benchmarks/step_table_cost.py``: 18-25 us per 6-span step here, beside the local copy's 45-67 us
(about 40 % more; 5 % more bytes).

A failed write turns the table off (said once on stderr) and its record says it is incomplete; the
analyzer then reads the spans. Training and the other outputs go on.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.emit.spans import SpanData, StepSpans
from traceml_otel.wire._json import ensure_run_dir
from traceml_otel.wire.step_table import (
    COLUMNS,
    TableRecord,
    table_file_name,
    write_table_record,
)

PHASE_SLOT = {name: index for index, name in enumerate(c.PHASE_SPAN_NAMES.values())}
"""A phase span's name to its slot in the table's per-phase columns."""
_N = len(c.PHASES)
_LOADER = (
    c.ATTR_LOADER_NUM_WORKERS, c.ATTR_LOADER_PIN_MEMORY, c.ATTR_LOADER_PERSISTENT_WORKERS,
    c.ATTR_LOADER_PREFETCH_FACTOR, c.ATTR_LOADER_BATCH_SIZE, c.ATTR_LOADER_DATASET,
)


def _ints(values: object) -> str | None:
    if not isinstance(values, list | tuple):
        return None
    return " ".join(str(int(v)) for v in values[: c.MAX_COMM_ENTRIES])


def step_row(spans: StepSpans) -> list[object]:
    """One step's row, in :data:`~traceml_otel.wire.step_table.COLUMNS` order (``None``: empty field)."""
    step: SpanData = spans.step
    a = step.attributes
    get = a.get
    calls = [0] * _N
    cpu: list[float | None] = [0.0] * _N
    gpu: list[float | None] = [0.0] * _N
    comm_cpu = [0.0] * _N
    comm_gpu = [0.0] * _N
    for phase in spans.phases:
        slot = PHASE_SLOT.get(phase.name)
        if slot is None:
            continue
        p = phase.attributes
        calls[slot] += 1
        seconds = p.get(_PHASE_CPU)
        total = cpu[slot]
        cpu[slot] = None if total is None or seconds is None else total + seconds  # type: ignore[operator]
        seconds = p.get(_PHASE_GPU)
        total = gpu[slot]
        gpu[slot] = None if total is None or seconds is None else total + seconds  # type: ignore[operator]
        if _PHASE_COMM_CPU in p or _PHASE_COMM_GPU in p:
            comm_cpu[slot] += p.get(_PHASE_COMM_CPU) or 0.0  # type: ignore[operator]
            comm_gpu[slot] += p.get(_PHASE_COMM_GPU) or 0.0  # type: ignore[operator]
    for slot in range(_N):
        if not calls[slot]:
            cpu[slot] = gpu[slot] = None
    if c.ATTR_COMM_CALLS in a:
        communication = [
            get(c.ATTR_COMM_CALLS), get(c.ATTR_COMM_BYTES), get(c.ATTR_COMM_CPU), get(c.ATTR_COMM_GPU),
            get(c.ATTR_COMM_EXPOSED_CPU), get(c.ATTR_COMM_EXPOSED_GPU), *comm_cpu, *comm_gpu,
            _ints(get(c.ATTR_COMM_ENTRIES)), _ints(get(c.ATTR_COMM_WORK)),
        ]
    else:
        communication = [None] * 6 + comm_cpu + comm_gpu + [None, None]
    if c.ATTR_LOADER_NUM_WORKERS in a:
        loader = [_bool(v) if isinstance(v, bool) else v for v in map(get, _LOADER)]
    else:
        loader = _NO_LOADER
    return [
        get(_RUN_ID), get(_RANK), get(_STEP), f"{step.trace_id:032x}", step.start_ns,
        get(_PARALLELISM) or "none", get(_WORLD_SIZE),
        get(_STEP_CPU), get(_STEP_GPU), get(_WAIT_CPU), get(_WAIT_GPU), get(_PREFETCH_H2D),
        *calls, *cpu, *gpu,
        get(_OPTIMIZER_STEPS), get(_PEAK_ALLOCATED), get(_PEAK_RESERVED), get(_MEM_TOTAL),
        get(_EXCEPTION_TYPE) or step.error, get(_SAMPLES), get(_TOKENS),
        *communication,
        get(_BETWEEN), get(_SOURCE), get(_HOST_CPUS), *loader,
        1 + len(spans.phases) + len(spans.collectives), get(_SKIPPED),
    ]


_NO_LOADER = [None] * len(_LOADER)
_RUN_ID, _RANK, _STEP, _PARALLELISM = c.ATTR_RUN_ID, c.ATTR_RANK, c.ATTR_STEP, c.ATTR_PARALLELISM
_WORLD_SIZE, _STEP_CPU, _STEP_GPU = c.ATTR_WORLD_SIZE, c.ATTR_STEP_CPU_DURATION, c.ATTR_STEP_GPU_DURATION
_WAIT_CPU, _WAIT_GPU, _PREFETCH_H2D = c.ATTR_INPUT_WAIT_CPU, c.ATTR_INPUT_WAIT_GPU, c.ATTR_PREFETCH_H2D_CPU
_OPTIMIZER_STEPS, _MEM_TOTAL = c.ATTR_OPTIMIZER_STEPS, c.ATTR_MEM_TOTAL
_PEAK_ALLOCATED, _PEAK_RESERVED = c.ATTR_MEM_PEAK_ALLOCATED, c.ATTR_MEM_PEAK_RESERVED
_EXCEPTION_TYPE, _SAMPLES, _TOKENS = c.ATTR_EXCEPTION_TYPE, c.ATTR_STEP_SAMPLES, c.ATTR_STEP_TOKENS
_BETWEEN, _SOURCE, _HOST_CPUS = c.ATTR_BETWEEN_STEPS_CPU, c.ATTR_STEP_SOURCE, c.ATTR_HOST_CPUS
_SKIPPED = c.ATTR_OPTIMIZER_SKIPPED
_PHASE_CPU, _PHASE_GPU = c.ATTR_PHASE_CPU_DURATION, c.ATTR_PHASE_GPU_DURATION
_PHASE_COMM_CPU, _PHASE_COMM_GPU = c.ATTR_PHASE_COMM_EXPOSED_CPU, c.ATTR_PHASE_COMM_EXPOSED_GPU


def _bool(value: bool) -> str:
    return "true" if value else "false"


_line_buffer = io.StringIO()
_line_writer = csv.writer(_line_buffer, lineterminator="\n")


def csv_line(row: Sequence[object]) -> str:
    """One row as the table's CSV writer writes it, newline included."""
    _line_buffer.seek(0)
    _line_buffer.truncate()
    _line_writer.writerow(row)
    return _line_buffer.getvalue()


_SLOT_MARK = "\x1eslot\x1e"  # a field the CSV writer leaves unquoted; never in a real value


def row_template(row: Sequence[object], slots: Sequence[tuple[int, str]]) -> str | None:
    """``row``'s CSV line as a ``%`` template whose fields at the given column indices are slots with
    the given conversion specs (``%d``, ``%s``, ...), in column order; every other field is
    written in as it is now. ``None`` when that cannot be done (the caller checks the filled template
    against :func:`csv_line`)."""
    marked = list(row)
    for index, _ in slots:
        marked[index] = _SLOT_MARK
    pieces = csv_line(marked).replace("%", "%%").split(_SLOT_MARK)
    if len(pieces) != len(slots) + 1:
        return None
    specs = [*(spec for _, spec in slots), ""]
    return "".join(piece + spec for piece, spec in zip(pieces, specs, strict=True))


class StepTableWriter:
    """Appends rows to one rank's ``rank-R.steps.csv`` (header first when the file is new).

    Each batch is one ``write`` handed to the OS; a failed write cuts the file back to its last whole
    row and raises ``OSError``. Opened with ``O_NOFOLLOW`` (a planted link is refused).
    """

    def __init__(self, path: Path) -> None:
        ensure_run_dir(path.parent)
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self._fd: int | None = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._complete_bytes = os.lseek(self._fd, 0, os.SEEK_END)
        self.rows = 0
        if self._complete_bytes == 0:
            self._append(",".join(COLUMNS) + "\n")

    def write(self, steps: Sequence[StepSpans]) -> None:
        """Append one row per step."""
        self.write_lines([csv_line(step_row(s)) for s in steps], len(steps))

    def write_lines(self, lines: list[str], rows: int) -> None:
        """Append ``rows`` rows already written as CSV lines (:func:`csv_line`, or filled templates), in
        chunks of one or more lines."""
        if not lines or self._fd is None:
            return
        self._append("".join(lines))
        self.rows += rows

    def _append(self, text: str) -> None:
        assert self._fd is not None
        encoded = text.encode()
        data = memoryview(encoded)
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError:
            try:
                os.ftruncate(self._fd, self._complete_bytes)
            except OSError:
                pass
            raise
        self._complete_bytes += len(encoded)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class StepTable:
    """The emitter's step table for one rank: never raises, counts what it could not write.

    ``warn`` says a failure once (the emitter's stderr line). :meth:`close` writes
    ``rank-R.steps.json`` with the rows and whether every step handed over has one.
    """

    def __init__(self, run_dir: Path, run_id: str, rank: int, warn: Callable[[str], None],
                 service: str = "") -> None:
        self.run_dir, self.run_id, self.rank, self._warn = run_dir, run_id, rank, warn
        self.service = service
        self.lost = 0
        """Steps handed over that have no row (the table was off or a write failed)."""
        self.problem = ""
        self.rows = 0
        self._writer: StepTableWriter | None = None
        try:
            self._writer = StepTableWriter(run_dir / table_file_name(rank))
        except OSError as error:
            self._fail(f"cannot open it in {run_dir} ({type(error).__name__}: {error})")

    def _fail(self, problem: str) -> None:
        self.problem = problem
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        self._warn(f"step table turned off: {problem}; `traceml analyze` reads the spans instead")

    def write(self, steps: Sequence[StepSpans]) -> None:
        """Append rows for ``steps`` (a failure turns the table off and counts them lost)."""
        self._guarded(len(steps), lambda writer: writer.write(steps))

    def write_lines(self, lines: list[str], rows: int) -> None:
        """Append ``rows`` rows already encoded as CSV lines, in chunks of one or more lines (a failure
        turns the table off and counts them lost)."""
        self._guarded(rows, lambda writer: writer.write_lines(lines, rows))

    def _guarded(self, rows: int, write: Callable[[StepTableWriter], None]) -> None:
        if self._writer is None:
            self.lost += rows
            return
        try:
            write(self._writer)
            self.rows += rows
        except (OSError, ValueError, TypeError) as error:
            self.lost += rows
            self._fail(f"writing failed after {self.rows} rows ({type(error).__name__}: {error})")

    def close(self) -> None:
        """Close the table and write its record (a failure to write the record leaves it incomplete)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as error:
                self.problem = f"closing failed ({type(error).__name__})"
                self.lost += 1
            self._writer = None
        problem = self.problem or (f"{self.lost} steps have no row" if self.lost else "")
        try:
            write_table_record(self.run_dir, TableRecord(
                run_id=self.run_id, rank=self.rank, rows=self.rows,
                complete=not self.lost and not self.problem, problem=problem, service=self.service,
            ))
        except OSError as error:
            self._warn(f"the step table's record could not be written ({type(error).__name__}: {error})")
