"""The step record's layout, declared once: one :class:`StepField` per slot of the wire row.

Every other form of a step is derived from :data:`STEP_FIELDS` at import time, or held to it by a
test (``tests/wire/test_step_schema.py``):

- the wire row (:class:`~traceml_otel.wire.step_row.StepRow`): its named slots, its length, the
  defaults of appended slots, :meth:`~traceml_otel.wire.step_row.StepRow.of` and
  :func:`~traceml_otel.wire.step_row.decode_step` (into
  :class:`~traceml_otel.step_records.StepRecord`, whose field each slot names);
- the step span's optional attributes (:mod:`traceml_otel.emit.spans`), in the table's order;
- the column-at-a-time encoder's flat layout and its checks (:mod:`traceml_otel.emit.step_lines`);
- the step table's columns and their SQL types (:mod:`traceml_otel.wire.step_table`) and the CSV
  reference row (:mod:`traceml_otel.emit.step_table`);
- docs/telemetry.md's tables (``tests/test_doc_sync.py`` reads this one);
- the analysis's copies made before a step (``StepTiming.h2d_before_cpu``): the sum of the fields
  that sum into ``h2d`` (:data:`H2D_BEFORE_STEP`), read by attribute and column.

Three orders are frozen by the files that carry them, and the table keeps each: the table's order is
the step span's attribute order (the contract's), ``slot`` is the position on the wire (only ever
appended: a new field takes the next slot), and ``column_at`` the position in the step table
(``None``: appended after the last column).

Adding a field (say ``grad_norm``, a number the training thread measures per step): append a
:class:`StepField` here with the next ``slot``, its ``default`` (what an older trainer's shorter row
decodes to), its attribute (add the name to ``contract.py``) and column; add the
:class:`~traceml_otel.step_records.StepRecord` field it names (with the same default); fill the slot
at the capture site (``capture/recorder.py``'s ``end_step`` row); document it in
docs/telemetry.md's table and bump ``wire.step_table.TABLE_VERSION`` for the new column. Nothing else
is edited by hand: ``tests/wire/test_step_schema.py`` checks every derived form carries it. A time that
belongs to a phase but is measured before the block (more copies made ahead, like a prepared loader's)
takes ``sums_into="h2d"``: the analysis then adds it to the step's h2d and step time, unnamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traceml_otel.contract import (
    ATTR_BETWEEN_STEPS_CPU,
    ATTR_EXCEPTION_TYPE,
    ATTR_H2D_BYTES,
    ATTR_INPUT_WAIT_CPU,
    ATTR_INPUT_WAIT_FETCHES,
    ATTR_INPUT_WAIT_GPU,
    ATTR_INPUT_WAIT_IN_STEP_CPU,
    ATTR_MEM_PEAK_ALLOCATED,
    ATTR_MEM_PEAK_RESERVED,
    ATTR_MEM_TOTAL,
    ATTR_OPTIMIZER_SKIPPED,
    ATTR_OPTIMIZER_STEPS,
    ATTR_PARALLELISM,
    ATTR_PHASE_CALL,
    ATTR_PHASE_CPU_DURATION,
    ATTR_PHASE_GPU_DURATION,
    ATTR_PREFETCH_H2D_CPU,
    ATTR_STEP,
    ATTR_STEP_GPU_DURATION,
    ATTR_STEP_SAMPLES,
    ATTR_STEP_SOURCE,
    ATTR_STEP_TOKENS,
)

NS = 1e-9
"""The scale from the wire's nanoseconds to the attributes' and columns' seconds."""
STEP_SECTION = "Attributes on `traceml.step`"
"""docs/telemetry.md's section that lists the step span's attributes."""

NUMBER, KEY, REFERENCE, SPECIAL = "number", "key", "reference", "special"
"""How the column-at-a-time encoder (``emit/step_lines.py``) takes a slot: ``number`` -- a value it
writes into the texts a column at a time (integer, or seconds when ``scale`` is :data:`NS`);
``key`` -- part of a row's shape (every row of a shape has the same value); ``reference`` -- a row
with a value set (not ``None``, not 0, not empty) takes the reference path; ``special`` -- the
encoder handles it by name (ids, times, phase calls)."""


@dataclass(frozen=True, slots=True)
class StepField:
    """One slot of the step row and every form it takes on its way to the files."""

    name: str
    """The slot's name (:class:`~traceml_otel.wire.step_row.StepRow`'s)."""
    slot: int
    """Its position in the wire row (append-only)."""
    kind: type
    """The type of a measured value (``None`` is "not measured" for any field whose default is None)."""
    doc: str
    default: Any = None
    """The value when not measured; an appended slot's value in an older trainer's shorter row."""
    record: str = ""
    """The :class:`~traceml_otel.step_records.StepRecord` field it decodes to ('' : ``name``)."""
    scale: float = 1.0
    """Wire unit to the attribute's and column's unit (:data:`NS`: nanoseconds to seconds)."""
    attribute: str | None = None
    """The ``traceml.step`` span attribute written from it in the table's optional chain (``None``:
    none, or written by hand by the span builder, see ``always``)."""
    absent_when_zero: bool = False
    """The attribute is left out when the value is 0 too (else only when it is ``None``)."""
    always: bool = False
    """The span builder writes the attribute itself, on every step span (step number, parallelism,
    optimizer steps): not part of the optional chain."""
    column: str | None = None
    """Its step-table (CSV) column, holding the attribute's value (``None``: no column)."""
    column_at: int | None = None
    """The column's position in the table (``None``: after the last, for a new field)."""
    sql: str = "BIGINT"
    """The column's SQL type (``DOUBLE`` for seconds)."""
    per_phase: bool = False
    """The value is summed per phase into the table's per-phase columns (a step slot is not: the
    phase calls' durations are, see :data:`PHASE_FIELDS`)."""
    encoder: str = NUMBER
    """How the column-at-a-time encoder takes it (:data:`NUMBER`, :data:`KEY`, ...)."""
    doc_section: str = STEP_SECTION
    """Where docs/telemetry.md lists its attribute."""
    sums_into: str | None = None
    """The phase whose time the value adds to although it ran before the block (``"h2d"``: a prepared
    loader's copies). The analysis reads such fields by their attribute and column
    (:data:`H2D_BEFORE_STEP`), never by name; ``None``: no phase's."""

    @property
    def record_field(self) -> str:
        return self.record or self.name


# The table, in the step span's attribute order (the contract's). ``slot`` is the wire position.
STEP_FIELDS: tuple[StepField, ...] = (
    StepField("step", 0, int, "The rank's step index, from 0.", default=0, attribute=ATTR_STEP,
              always=True, column="step", column_at=2, encoder=SPECIAL,
              doc_section="Attributes on every traceml span"),
    StepField("parallelism", 9, str, "``none``, ``ddp``, ``fsdp``, ...", default="none",
              attribute=ATTR_PARALLELISM, always=True, column="parallelism", column_at=5, sql="VARCHAR",
              encoder=KEY),
    StepField("start_ns", 1, int, "CPU clock reading when the ``trace_step`` block opened.", default=0,
              column="start_unix_nano", column_at=4, encoder=SPECIAL),
    StepField("end_ns", 2, int, "CPU clock reading when it closed.", default=0, encoder=SPECIAL),
    StepField("optimizer_steps", 8, int, "Optimizer updates in the step.", default=0,
              attribute=ATTR_OPTIMIZER_STEPS, always=True, column="optimizer_steps", column_at=24),
    StepField("gpu_duration_ns", 3, int, "CUDA events: start to end of the step on the device.", scale=NS,
              attribute=ATTR_STEP_GPU_DURATION, column="traced_gpu", column_at=8, sql="DOUBLE"),
    StepField("input_wait_ns", 4, int, "CPU time spent in the fetches before the step.", scale=NS,
              attribute=ATTR_INPUT_WAIT_CPU, column="input_wait_cpu", column_at=9, sql="DOUBLE"),
    StepField("input_wait_gpu_ns", 5, int, "CUDA events: the same fetches, on the device.", scale=NS,
              attribute=ATTR_INPUT_WAIT_GPU, column="input_wait_gpu", column_at=10, sql="DOUBLE"),
    StepField("skipped_updates", 22, int, "Appended: updates a ``GradScaler.step`` skipped in the step "
              "(inf/NaN gradients: ``optimizer.step()`` not called).", default=0,
              attribute=ATTR_OPTIMIZER_SKIPPED, absent_when_zero=True, encoder=REFERENCE,
              column="skipped_updates", sql="BIGINT"),
    StepField("input_wait_in_step_ns", 21, int, "Appended: CPU time in batch fetches inside the block "
              "(gradient accumulation's later micro-batches); 0 (or None) when there was none.", scale=NS,
              attribute=ATTR_INPUT_WAIT_IN_STEP_CPU, encoder=REFERENCE),
    StepField("prefetch_h2d_ns", 7, int, "Host-to-device copies a prepared loader made before the step.",
              scale=NS, attribute=ATTR_PREFETCH_H2D_CPU, column="prefetch_h2d_cpu", column_at=11,
              sql="DOUBLE", sums_into="h2d"),
    StepField("peak_allocated_bytes", 10, int, "CUDA peak allocated memory in the step.",
              attribute=ATTR_MEM_PEAK_ALLOCATED, column="peak_allocated", column_at=25),
    StepField("peak_reserved_bytes", 11, int, "CUDA peak reserved memory in the step.",
              attribute=ATTR_MEM_PEAK_RESERVED, column="peak_reserved", column_at=26),
    StepField("device_total_bytes", 12, int, "The device's total memory.", attribute=ATTR_MEM_TOTAL,
              column="memory_total", column_at=27),
    StepField("exception_type", 13, str, "The exception that left the block, if any.",
              attribute=ATTR_EXCEPTION_TYPE, encoder=REFERENCE),
    StepField("source", 19, str, "Appended: how the step was found: ``trace_step``, ``hf_trainer``, "
              "``lightning`` or ``inferred``.", attribute=ATTR_STEP_SOURCE, column="source", column_at=48,
              sql="VARCHAR", encoder=KEY),
    StepField("between_ns", 20, int, "Appended: CPU time from the end of this rank's previous step to this "
              "step's start, less time in ``outside_step`` blocks; None on the first step.",
              record="between_steps_ns", scale=NS, attribute=ATTR_BETWEEN_STEPS_CPU, column="between_cpu",
              column_at=47, sql="DOUBLE"),
    StepField("input_fetches", 6, int, "How many fetches fed the step.", default=0,
              attribute=ATTR_INPUT_WAIT_FETCHES, absent_when_zero=True),
    StepField("samples", 16, int, "Appended: samples in the step.", attribute=ATTR_STEP_SAMPLES,
              column="samples", column_at=29),
    StepField("tokens", 17, int, "Appended: tokens in the step.", attribute=ATTR_STEP_TOKENS,
              column="tokens", column_at=30),
    StepField("phases", 14, list, "The phase calls, in order, in :class:`PhaseRow`'s layout (plain lists "
              "or PhaseRows).", default=(), encoder=SPECIAL),
    StepField("collectives", 15, list, "Appended: the collective calls (``[]`` before).", default=(),
              encoder=REFERENCE),
    StepField("loader", 18, list, "Appended: ``[num_workers, pin_memory, persistent_workers, "
              "prefetch_factor, batch_size, dataset]`` of a newly seen DataLoader (``dataset``, the class "
              "name, appended last).", encoder=REFERENCE),
)

FIRST_LAYOUT_FIELDS = 15
"""Slots in the first layout (up to ``phases``); every later slot was appended."""

WIRE_ORDER: tuple[StepField, ...] = tuple(sorted(STEP_FIELDS, key=lambda f: f.slot))
"""The fields in slot order (the wire row's)."""
SLOT: dict[str, int] = {f.name: f.slot for f in STEP_FIELDS}
"""A slot's position by its name."""
ROW_FIELDS = len(STEP_FIELDS)
"""Slots in a row of this version."""
SUMS_INTO = ("h2d",)
"""The phases a field may sum into (:attr:`StepField.sums_into`): those the analysis reads."""
H2D_BEFORE_STEP: tuple[StepField, ...] = tuple(f for f in STEP_FIELDS if f.sums_into == "h2d")
"""The fields whose seconds the analysis adds to a step's h2d time as copies made before its block
(``StepTiming.h2d_before_cpu``, their sum): by attribute (the span reader) and column (the columnar
engine)."""


@dataclass(frozen=True, slots=True)
class PhaseField:
    """One slot of a phase call's row (``PhaseRow``)."""

    name: str
    doc: str
    attribute: str | None = None
    """The phase span's attribute written from it (by the span builder)."""
    per_phase: bool = False
    """Summed over a step's calls of a phase into the table's ``{column}_{phase}`` columns."""
    column: str | None = None


PHASE_FIELDS: tuple[PhaseField, ...] = (
    PhaseField("phase", "``forward``, ``backward``, ``optimizer`` or ``h2d``."),
    PhaseField("call", "Which call of this phase in the step, from 0; ``None`` as the training thread "
                       "appends it (the emitter numbers it, :func:`calls_in_order`).", ATTR_PHASE_CALL),
    PhaseField("start_ns", "CPU clock reading at the start."),
    PhaseField("end_ns", "CPU clock reading at the end.", ATTR_PHASE_CPU_DURATION, True, "cpu"),
    PhaseField("gpu_offset_ns", "CUDA events: from the step's start event to this call's start."),
    PhaseField("gpu_duration_ns", "CUDA events: this call's duration on the device.",
               ATTR_PHASE_GPU_DURATION, True, "gpu"),
    PhaseField("nbytes", "Bytes moved (h2d copies only).", ATTR_H2D_BYTES),
)
"""The phase row's slots, in wire order (``end_ns`` stands for the call's CPU duration, end - start)."""
PHASE_WIDTH = len(PHASE_FIELDS)


def check(fields: tuple[StepField, ...] = STEP_FIELDS) -> None:
    """Raise ``ValueError`` when a table is not one layout: slots ``0..n-1`` once each, names and
    columns unique, the first layout's slots not appended."""
    slots = sorted(f.slot for f in fields)
    if slots != list(range(len(fields))):
        raise ValueError(f"slots must be 0..{len(fields) - 1} once each, not {slots}")
    names = [f.name for f in fields]
    columns = [f.column for f in fields if f.column]
    attributes = [f.attribute for f in fields if f.attribute]
    for what, values in (("name", names), ("column", columns), ("attribute", attributes)):
        if len(set(values)) != len(values):
            raise ValueError(f"a {what} is declared twice: {values}")
    for f in fields:
        if f.sums_into is not None and (f.sums_into not in SUMS_INTO or f.scale != NS or not f.attribute
                                        or not f.column):
            raise ValueError(f"{f.name} sums into {f.sums_into!r}: it must be one of {SUMS_INTO}, in "
                             "nanoseconds, with an attribute and a column")


def appended_defaults(fields: tuple[StepField, ...] = STEP_FIELDS) -> tuple[Any, ...]:
    """The values of the appended slots, in slot order, that a shorter row lacks."""
    return tuple(f.default for f in sorted(fields, key=lambda f: f.slot)[FIRST_LAYOUT_FIELDS:])


check()
