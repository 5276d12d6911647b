"""A templated run's steps as the step metrics and the live time account read them, a column at a time.

With OTLP span export on and no span budget, a templated run's steps need no
:class:`~traceml_otel.step_records.StepRecord` for their spans (:mod:`traceml_otel.emit.step_protobuf`).
What still read one record per step were the step metrics and the live time account: decoding each
row (about 3 µs a step in a real run) and reading each record back (about 3 more) was a sixth of the
emitter's CPU. A :class:`StepRun` keeps the run's rows and their columns
(:class:`~traceml_otel.emit.step_columns.StepColumns`); :meth:`StepRun.measures` works out, a column
at a time, the values those readers take from each record, by the decoder's rules (an input wait
inside the block is input wait too; a negative gap between steps is not known). :meth:`StepRun.records`
decodes the rows when a reader needs records after all: the scrape endpoint, the time account's first
or redone steps and stalls, the span budget.

``tests/emit/test_step_run.py`` holds the metrics and the time account fed this way to the record path,
point for point, on random runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import sub
from typing import Any, Protocol

from traceml_otel.emit.step_columns import NS, StepColumns
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.step_row import decode_step
from traceml_otel.wire.step_schema import SLOT

_STEP, _START, _END, _GPU = SLOT["step"], SLOT["start_ns"], SLOT["end_ns"], SLOT["gpu_duration_ns"]
_WAIT, _WAIT_GPU, _PREFETCH = SLOT["input_wait_ns"], SLOT["input_wait_gpu_ns"], SLOT["prefetch_h2d_ns"]
_WAIT_INSIDE, _BETWEEN = SLOT["input_wait_in_step_ns"], SLOT["between_ns"]
_ALLOCATED, _RESERVED = SLOT["peak_allocated_bytes"], SLOT["peak_reserved_bytes"]
_SAMPLES, _TOKENS = SLOT["samples"], SLOT["tokens"]
# a phase call's slots (wire/step_row.py's PhaseRow)
_PHASE, _PHASE_START, _PHASE_END, _PHASE_GPU = 0, 2, 3, 5


@dataclass(frozen=True, slots=True)
class RunMeasures:
    """Each step's values the metrics and the time account read, as columns in step order."""

    steps: list[int]
    step_seconds: list[float]
    """The traced step time on the step's clock (the device's when measured there)."""
    waits: list[float | None]
    """The input wait before the step, in seconds (``None``: not measured)."""
    phases: list[tuple[str, list[float]]]
    """Each phase call's name and its durations on the step's clock, in call order."""
    end_ns: list[int]
    peaks: tuple[list[int], list[int]] | None
    """CUDA peak allocated and reserved bytes; ``None``: not measured."""
    samples: list[Any]
    tokens: list[Any]
    wait_ns: list[int]
    """The time account's ``step.input_wait``: the wait before the block and the fetches inside it."""
    between_ns: list[int]
    """The gap before the step less that wait (0 on a step with no known gap)."""
    block_ns: list[int]
    """The block less the fetches inside it."""


class StepRun:
    """A templated run's rows, read a column at a time (:meth:`measures`) or as records (:meth:`records`)."""

    __slots__ = ("_measures", "_records", "anchor_ns", "columns", "rows")

    def __init__(self, rows: list[Any], anchor_ns: int, columns: StepColumns) -> None:
        self.rows, self.anchor_ns, self.columns = rows, anchor_ns, columns
        self._records: list[StepRecord] | None = None
        self._measures: RunMeasures | None = None

    def records(self) -> list[StepRecord]:
        """Every row decoded (once), as :func:`~traceml_otel.wire.step_row.decode_step` gives it."""
        if self._records is None:
            self._records = [decode_step(row, self.anchor_ns) for row in self.rows]
        return self._records

    def measures(self) -> RunMeasures:
        """The run's values for the metrics and the time account (worked out once)."""
        if self._measures is None:
            self._measures = _measures(self.columns, self.anchor_ns)
        return self._measures


def _measures(columns: StepColumns, anchor_ns: int) -> RunMeasures:
    """What each row's record would give: a run has one shape, so a slot is ``None`` in all of its
    rows or in none (its types are the shape's)."""
    step = columns.step
    start, end = step[_START], step[_END]
    steps = len(start)
    inside: Sequence[int] = [0] * steps  # the fetches inside the block (the record's None: 0)
    waits_ns: Sequence[int | None] = step[_WAIT]
    if isinstance(step[_WAIT_INSIDE][0], int):  # as the decoder: a positive one is input wait too
        inside = [value if value > 0 else 0 for value in step[_WAIT_INSIDE]]
        waits_ns = [wait if extra <= 0 else (wait or 0) + extra
                    for wait, extra in zip(waits_ns, inside, strict=True)]
    on_gpu = step[_GPU][0] is not None
    if on_gpu:
        step_seconds = [value * NS for value in step[_GPU]]
    else:
        step_seconds = [(e - s - i) * NS for s, e, i in zip(start, end, inside, strict=True)]
    waits: list[float | None]
    if on_gpu and step[_WAIT_GPU][0] is not None:
        waits = [None if wait is None else gpu * NS
                 for wait, gpu in zip(waits_ns, step[_WAIT_GPU], strict=True)]
    else:
        waits = [None if wait is None else wait * NS for wait in waits_ns]
    phases = []
    for call in columns.phases:
        gpu = call[_PHASE_GPU]
        if on_gpu and gpu[0] is not None:
            seconds = [value * NS for value in gpu]
        else:
            seconds = [value * NS for value in map(sub, call[_PHASE_END], call[_PHASE_START])]
        phases.append((call[_PHASE][0], seconds))
    allocated, reserved = step[_ALLOCATED], step[_RESERVED]
    peaks = None if allocated[0] is None or reserved[0] is None else (list(allocated), list(reserved))
    prefetch = step[_PREFETCH]
    before = [(wait or 0) + (copy or 0) - i for wait, copy, i in zip(waits_ns, prefetch, inside, strict=True)]
    between = [0 if not isinstance(gap, int) or gap < 0 else max(0, gap - wait)
               for gap, wait in zip(step[_BETWEEN], before, strict=True)]
    return RunMeasures(
        steps=list(step[_STEP]), step_seconds=step_seconds, waits=waits, phases=phases,
        end_ns=[value + anchor_ns for value in end], peaks=peaks,
        samples=list(step[_SAMPLES]), tokens=list(step[_TOKENS]),
        wait_ns=[wait + i for wait, i in zip(before, inside, strict=True)], between_ns=between,
        block_ns=[max(0, e - s - i) for s, e, i in zip(start, end, inside, strict=True)],
    )


def resolve_records(records: Sequence[StepRecord | None], built: Sequence[object]) -> list[StepRecord]:
    """``records`` with each step left to its run (``None``) decoded from that run."""
    if None not in records:
        return list(records)  # type: ignore[arg-type]
    resolved = []
    for record, step in zip(records, built, strict=True):
        if record is None:
            run: StepRun = step.run  # type: ignore[attr-defined]
            record = run.records()[step.index]  # type: ignore[attr-defined]
        resolved.append(record)
    return resolved


def run_segments(steps: Sequence[tuple[StepRecord | None, Any, bool]],
                 ) -> list[tuple[StepRun | None, int, list[Any]]]:
    """A batch's (record, built, exemplar) steps cut, in order, into ``(None, 0, steps)`` for steps
    that have their records and ``(run, first, steps)`` for consecutive steps left to one run (its
    rows ``first`` onwards)."""
    segments: list[tuple[StepRun | None, int, list[Any]]] = []
    for item in steps:
        run: StepRun | None = None if item[0] is not None else item[1].run
        if segments:
            last_run, first, last_steps = segments[-1]
            if last_run is run and (run is None or item[1].index == first + len(last_steps)):
                last_steps.append(item)
                continue
        segments.append((run, 0 if run is None else item[1].index, [item]))
    return segments


class _HasIds(Protocol):
    trace_id: int
    span_id: int


def exemplar_ids(steps: list[tuple[Any, _HasIds, bool]]) -> list[tuple[int, int] | None]:
    """Each step's exemplar context: its trace and step span id when its trace was sent."""
    return [(built.trace_id, built.span_id) if exemplar else None for _, built, exemplar in steps]
