"""A step's local-copy spans and step-table row straight from its step row.

Neither the local copy nor the step table needs span objects, and with no OTLP endpoint and no
metrics (the default) they are the emitter's only outputs. Decoding each step row into a
:class:`~traceml_otel.step_records.StepRecord`, building spans from it (an attribute dict and a
``SpanData`` each) and walking them twice (JSON, CSV) was most of the emitter's CPU; now the record
and spans are built only for OTLP export and metrics (``keep_spans``), with the ids the text already
has. Each step *shape* (which optional values the row has and of which types, its parallelism,
source and phase sequence) gets two ``%`` templates: the JSON of all its spans, with every value that
repeats within the shape (run id, rank, host, names, clock) written in, and its CSV line. A later row
of the shape only fills in its ids and numbers, read from the row's slots
(:class:`~traceml_otel.wire.step_row.StepRow`).

Exactness. A shape's templates are made from the reference path's output for its first row
(:func:`~traceml_otel.wire.step_row.decode_step`, :class:`~traceml_otel.emit.spans.StepSpanBuilder`,
:func:`~traceml_otel.emit.local_copy.span_json`, :func:`~traceml_otel.emit.step_table.step_row`),
then filled with that row's values; unless both give the reference text byte for byte, the shape
always takes the reference path. Rows whose output depends on more than their shape take the
reference path every time: collectives (their spans group by kind), an exception (a span status), a
newly seen DataLoader, the rank's first step (the host's CPU count), a negative time between steps
(decoded as unknown), and a row of another layout (a shorter or longer row or phase row, which the
decoder pads or cuts). Span ids come from the builder's generator in the builder's order.
``tests/emit/test_step_lines.py`` compares both paths on thousands of random rows, odd ones included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.local_copy import span_json, span_template
from traceml_otel.emit.spans import StepSpanBuilder, StepSpans
from traceml_otel.emit.step_table import PHASE_SLOT, csv_line, row_template, step_row
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.step_row import ROW_FIELDS, decode_step
from traceml_otel.wire.step_table import COLUMNS

_NS = 1e-9
SHAPE_LIMIT = 256
"""Shapes templated per rank; steps of further shapes take the reference path."""

# One step's values in a flat list: the step span's ids and times, its numeric attributes, the
# table's per-phase sums, then seven slots per phase call.
_TRACE, _STEP_ID, _START, _END = 0, 1, 2, 3
_STEP_VALUES = {
    c.ATTR_STEP: 4, c.ATTR_STEP_CPU_DURATION: 5, c.ATTR_OPTIMIZER_STEPS: 6, c.ATTR_STEP_GPU_DURATION: 7,
    c.ATTR_INPUT_WAIT_CPU: 8, c.ATTR_INPUT_WAIT_GPU: 9, c.ATTR_PREFETCH_H2D_CPU: 10,
    c.ATTR_MEM_PEAK_ALLOCATED: 11, c.ATTR_MEM_PEAK_RESERVED: 12, c.ATTR_MEM_TOTAL: 13,
    c.ATTR_BETWEEN_STEPS_CPU: 14, c.ATTR_INPUT_WAIT_FETCHES: 15, c.ATTR_STEP_SAMPLES: 16,
    c.ATTR_STEP_TOKENS: 17,
}
_CPU_SUMS, _GPU_SUMS = 18, 18 + len(c.PHASES)
_FIRST_PHASE = _GPU_SUMS + len(c.PHASES)
_PHASE_ID, _PHASE_START, _PHASE_END = 0, 1, 2
_PHASE_VALUES = {c.ATTR_PHASE_CALL: 3, c.ATTR_PHASE_CPU_DURATION: 4, c.ATTR_PHASE_GPU_DURATION: 5,
                 c.ATTR_H2D_BYTES: 6}
_PHASE_WIDTH = 7
_STEP_VARIABLE = frozenset(_STEP_VALUES)
_PHASE_VARIABLE = frozenset([c.ATTR_STEP, *_PHASE_VALUES])

_TABLE_VALUES = {
    "step": 4, "trace_id": _TRACE, "start_unix_nano": _START, "traced_cpu": 5, "traced_gpu": 7,
    "input_wait_cpu": 8, "input_wait_gpu": 9, "prefetch_h2d_cpu": 10, "optimizer_steps": 6,
    "peak_allocated": 11, "peak_reserved": 12, "memory_total": 13, "samples": 16, "tokens": 17,
    "between_cpu": 14,
    **{f"cpu_{phase}": _CPU_SUMS + i for i, phase in enumerate(c.PHASES)},
    **{f"gpu_{phase}": _GPU_SUMS + i for i, phase in enumerate(c.PHASES)},
}
_TABLE_SLOTS = [(COLUMNS.index(name), value) for name, value in _TABLE_VALUES.items()]

# Slots of a step row (wire/step_row.py's StepRow) the fast path reads or checks.
_ROW_FETCHES, _ROW_PARALLELISM, _ROW_EXCEPTION, _ROW_PHASES, _ROW_COLLECTIVES = 6, 9, 13, 14, 15
_ROW_LOADER, _ROW_SOURCE, _ROW_BETWEEN = 18, 19, 20
_ROW_NOT_NUMBERS = frozenset((_ROW_PARALLELISM, _ROW_EXCEPTION, _ROW_PHASES, _ROW_COLLECTIVES, _ROW_LOADER,
                              _ROW_SOURCE))


@dataclass(slots=True)
class EncodedSteps:
    """A batch of steps as the local copy and the step table write them."""

    spans_json: list[str]
    """Per step, its spans' JSON joined by commas."""
    rows: list[str]
    """Per step, its CSV line."""
    spans: int
    """Spans in ``spans_json``."""
    records: list[StepRecord] = field(default_factory=list)
    built: list[StepSpans] = field(default_factory=list)
    """With ``keep_spans``: each step's record and its span objects, with the ids its text has."""


@dataclass(frozen=True, slots=True)
class _Shape:
    spans: str
    """All the step's spans, comma-joined, as one ``%`` template."""
    span_values: Callable[[list[object]], tuple[object, ...]]
    row: str
    row_values: Callable[[list[object]], tuple[object, ...]]
    table_slots: tuple[int | None, ...] | None
    """Per phase call, its slot in the table's per-phase columns (None: a phase without a column);
    None when no phase is called twice (each per-phase column is then one call's own value)."""


_REFERENCE = None  # a shape whose templates did not reproduce the reference: always the reference path


class StepLines:
    """Encodes step rows for the local copy and the step table; one per rank, beside its span builder."""

    def __init__(self, builder: StepSpanBuilder) -> None:
        self._builder = builder
        self._run_id = builder.rank.run_id
        self._random_bits = builder.random_bits
        self._shapes: dict[tuple[object, ...], _Shape | None] = {}
        self.reference_steps = 0
        """Steps that took the reference path (the benchmarks and tests read it)."""

    def encode(self, rows: Sequence[Any], anchor_ns: int, keep_spans: bool = False) -> EncodedSteps:
        """The JSON of each row's spans and its CSV line, in order (``anchor_ns``: the trainer's
        clock offset, as :func:`~traceml_otel.wire.step_row.decode_step` takes it). With
        ``keep_spans`` (OTLP export or metrics need them) also each step's record and span objects,
        built with the same ids as the text."""
        spans_json: list[str] = []
        lines: list[str] = []
        spans = 0
        records: list[StepRecord] = []
        kept: list[StepSpans] = []
        shapes = self._shapes
        bits = self._random_bits
        trace_id = c.step_trace_id
        run_id = self._run_id
        for row in rows:
            try:
                key = None if self._builder.first else _shape_key(row)
            except (TypeError, ValueError, IndexError):
                key = None  # not a row the fast path reads: the decoder says what is wrong with it
            shape = False if key is None else shapes.get(key, False)
            if not shape:
                built = self._reference(row, anchor_ns, spans_json, lines)
                spans += built.count
                if shape is False and key is not None and len(shapes) < SHAPE_LIMIT:
                    shapes[key] = _make_shape(key, row, anchor_ns, built.spans, spans_json[-1], lines[-1])
                if keep_spans:
                    records.append(built.record)
                    kept.append(built.spans)
                continue
            phase_rows = row[_ROW_PHASES]
            step_id = bits(64) or 1
            phase_ids = [bits(64) or 1 for _ in phase_rows]
            values = _values(row, phase_rows, anchor_ns, trace_id(run_id, row[0]), step_id, phase_ids)
            if shape.table_slots is not None:
                _add_sums(values, phase_rows, shape.table_slots)
            spans_json.append(shape.spans % shape.span_values(values))
            lines.append(shape.row % shape.row_values(values))
            spans += 1 + len(phase_rows)
            if keep_spans:
                record = decode_step(row, anchor_ns)
                records.append(record)
                kept.append(self._builder.build(record, (step_id, phase_ids)))
        return EncodedSteps(spans_json, lines, spans, records, kept)

    def _reference(self, row: Any, anchor_ns: int, spans_json: list[str], lines: list[str]) -> _Built:
        record = decode_step(row, anchor_ns)
        built = self._builder.build(record)
        spans = built.all()
        spans_json.append(",".join([span_json(span) for span in spans]))
        lines.append(csv_line(step_row(built)))
        self.reference_steps += 1
        return _Built(record, built, len(spans))


@dataclass(frozen=True, slots=True)
class _Built:
    record: StepRecord
    spans: StepSpans
    count: int


def _shape_key(row: Any) -> tuple[object, ...] | None:
    """What decides a row's templates; ``None`` for a row that always takes the reference path."""
    if (type(row) is not list or len(row) != ROW_FIELDS or row[_ROW_COLLECTIVES]
            or row[_ROW_EXCEPTION] is not None or row[_ROW_LOADER]):
        return None
    between = row[_ROW_BETWEEN]
    if between is not None and between < 0:
        return None
    phase_rows = row[_ROW_PHASES]
    flat = tuple(chain.from_iterable(phase_rows))
    return (tuple(map(type, row)), row[_ROW_PARALLELISM], row[_ROW_SOURCE], not row[_ROW_FETCHES],
            tuple(map(len, phase_rows)), flat[::_PHASE_WIDTH], tuple(map(type, flat)))


_INTEGER_OR_NONE = (int, type(None))


def _make_shape(key: tuple[object, ...], row: list[Any], anchor_ns: int, built: StepSpans,
                reference_json: str, reference_line: str) -> _Shape | None:
    """Templates for the shape of ``row`` from its reference encoding; ``None`` (always the reference
    path) unless the filled templates give that encoding back byte for byte."""
    row_types, phase_lengths, phase_types = key[0], key[4], key[6]
    if any(kind not in _INTEGER_OR_NONE for i, kind in enumerate(row_types) if i not in _ROW_NOT_NUMBERS):
        return _REFERENCE  # floats or other kinds from a foreign trainer: the reference spells them
    if any(length != _PHASE_WIDTH for length in phase_lengths):  # type: ignore[attr-defined]
        return _REFERENCE
    if any(kind not in _INTEGER_OR_NONE for i, kind in enumerate(phase_types) if i % _PHASE_WIDTH):  # type: ignore[arg-type]
        return _REFERENCE
    step = span_template(built.step, _STEP_VARIABLE)
    if step is None:
        return _REFERENCE
    templates, picks = [step[0]], [_TRACE, _STEP_ID, _START, _END, *(_STEP_VALUES[k] for k in step[1])]
    for i, phase in enumerate(built.phases):
        made = span_template(phase, _PHASE_VARIABLE)
        if made is None:
            return _REFERENCE
        base = _FIRST_PHASE + i * _PHASE_WIDTH
        templates.append(made[0])
        picks += [_TRACE, base + _PHASE_ID, _STEP_ID, base + _PHASE_START, base + _PHASE_END,
                  *(_STEP_VALUES[k] if k == c.ATTR_STEP else base + _PHASE_VALUES[k] for k in made[1])]
    table_row = step_row(built)
    table_slots = [PHASE_SLOT.get(phase.name) for phase in built.phases]
    repeated = any(table_slots.count(slot) > 1 for slot in table_slots if slot is not None)
    own_value = {}  # a per-phase column of one call: that call's own value
    if not repeated:
        for i, slot in enumerate(table_slots):
            if slot is not None:
                base = _FIRST_PHASE + i * _PHASE_WIDTH
                own_value[_CPU_SUMS + slot] = base + _PHASE_VALUES[c.ATTR_PHASE_CPU_DURATION]
                own_value[_GPU_SUMS + slot] = base + _PHASE_VALUES[c.ATTR_PHASE_GPU_DURATION]
    slots = []
    for column, value_index in sorted(_TABLE_SLOTS):
        value_index = own_value.get(value_index, value_index)
        value = table_row[column]
        if value is None:
            continue
        kind = type(value)
        spec = "%s" if value_index == _TRACE or kind is float else "%d" if kind is int else None
        if spec is None:
            return _REFERENCE
        slots.append((column, spec, value_index))
    line = row_template(table_row, [(column, spec) for column, spec, _ in slots])
    if line is None:
        return _REFERENCE
    shape = _Shape(
        spans=",".join(templates), span_values=_getter(picks),
        row=line, row_values=_getter([value_index for _, _, value_index in slots]),
        table_slots=tuple(table_slots) if repeated else None,
    )
    phase_rows = row[_ROW_PHASES]
    values = _values(row, phase_rows, anchor_ns, built.step.trace_id, built.step.span_id,
                     [phase.span_id for phase in built.phases])
    if shape.table_slots is not None:
        _add_sums(values, phase_rows, shape.table_slots)
    try:
        same = (shape.spans % shape.span_values(values) == reference_json
                and shape.row % shape.row_values(values) == reference_line)
    except (TypeError, ValueError, OverflowError):
        same = False
    return shape if same else _REFERENCE


def _getter(indices: list[int]) -> Callable[[list[object]], tuple[object, ...]]:
    """An ``itemgetter`` that always returns a tuple (one index alone would return the item)."""
    if len(indices) == 1:
        index = indices[0]
        return lambda values: (values[index],)
    return itemgetter(*indices)


def _values(row: list[Any], phase_rows: list[list[Any]], anchor_ns: int, trace_id: int, step_id: int,
            phase_ids: list[int]) -> list[object]:
    """One step's values in the flat layout the templates pick from: what the decoder and the builder
    compute, with ids as hex text and each float as its ``repr`` text, made once for the JSON and the
    CSV line."""
    (step, start, end, gpu, wait, wait_gpu, fetches, prefetch, optimizer_steps, _, peak_allocated,
     peak_reserved, total, _, _, _, samples, tokens, _, _, between) = row
    start += anchor_ns
    end += anchor_ns
    values: list[object] = [
        format(trace_id, "032x"), format(step_id, "016x"), start, end, step, repr((end - start) * _NS),
        optimizer_steps,
        None if gpu is None else repr(gpu * _NS),
        None if wait is None else repr(wait * _NS),
        None if wait_gpu is None else repr(wait_gpu * _NS),
        None if prefetch is None else repr(prefetch * _NS),
        peak_allocated, peak_reserved, total,
        None if between is None else repr(between * _NS),
        fetches, samples, tokens, *_NO_SUMS,
    ]
    on_gpu = gpu is not None
    ends = []
    for (_, call, phase_start, phase_end, offset, phase_gpu, nbytes), phase_id in zip(
            phase_rows, phase_ids, strict=True):
        cpu_text = repr((phase_end - phase_start) * _NS)
        gpu_text = None if phase_gpu is None else repr(phase_gpu * _NS)
        if on_gpu and phase_gpu is not None and offset is not None:  # on the device's timeline
            phase_start = start + offset
            phase_end = phase_start + phase_gpu
        else:
            phase_start += anchor_ns
            phase_end += anchor_ns
        values += (format(phase_id, "016x"), phase_start, phase_end, call, cpu_text, gpu_text, nbytes)
        ends.append(phase_end)
    if not on_gpu:
        return values
    values[_END] = max(end, start + gpu, *ends)
    return values


_NO_SUMS = (None,) * (2 * len(c.PHASES))


def _add_sums(values: list[object], phase_rows: list[list[Any]], table_slots: tuple[int | None, ...]) -> None:
    """The table's per-phase sums (cpu, gpu) of a step that calls a phase more than once, added from
    0.0 in call order as the table's reference adds them."""
    sums = [0.0] * len(_NO_SUMS)
    for (_, _, phase_start, phase_end, _, phase_gpu, _), slot in zip(phase_rows, table_slots, strict=True):
        if slot is not None:
            sums[slot] += (phase_end - phase_start) * _NS
            if phase_gpu is not None:
                sums[len(c.PHASES) + slot] += phase_gpu * _NS
    values[_CPU_SUMS:_CPU_SUMS + len(sums)] = [repr(total) for total in sums]
