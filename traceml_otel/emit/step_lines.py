"""A step's local-copy spans and step-table row straight from its record: the default outputs' fast path.

With no OTLP endpoint and no metrics (the default), the local copy and the step table are the
emitter's only outputs, and neither needs span objects. Building them (an attribute dict and a
``SpanData`` per span) and then walking them twice (JSON, CSV) was most of the emitter's CPU. Here
each step *shape* (which optional values the step has and of which types, its parallelism, source
and phase sequence) gets two ``%`` templates: the JSON of all its spans, with every value that
repeats within the shape (run id, rank, host, names, clock) written in, and its CSV line. A later
step of the shape only fills in its ids and numbers, in C.

Exactness. A shape's templates are made from the reference path's output for its first step
(:class:`~traceml_otel.emit.spans.StepSpanBuilder`, :func:`~traceml_otel.emit.local_copy.span_json`,
:func:`~traceml_otel.emit.step_table.step_row`), then filled with that step's values; unless both
give the reference text byte for byte, the shape always takes the reference path. Steps whose
attributes depend on more than their shape take the reference path every time: collectives (their
spans group by kind), an exception (a span status), a newly seen DataLoader, and the rank's first
step (the host's CPU count). Span ids come from the builder's generator in the builder's order.
``tests/emit/test_step_lines.py`` compares both paths on thousands of random steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter

from traceml_otel import contract as c
from traceml_otel.emit.local_copy import span_json, span_template
from traceml_otel.emit.spans import StepSpanBuilder, StepSpans
from traceml_otel.emit.step_table import csv_line, row_template, step_row
from traceml_otel.step_records import StepRecord
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
_PHASE_SLOT = {c.PHASE_SPAN_NAMES.get(phase, f"traceml.{phase}"): i for i, phase in enumerate(c.PHASES)}

_step_fields = attrgetter(
    "step", "start_ns", "end_ns", "gpu_duration_ns", "input_wait_ns", "input_wait_gpu_ns", "input_fetches",
    "prefetch_h2d_ns", "optimizer_steps", "parallelism", "peak_allocated_bytes", "peak_reserved_bytes",
    "device_total_bytes", "samples", "tokens", "source", "between_steps_ns",
)
_phase_fields = attrgetter(
    "phase", "call", "start_ns", "end_ns", "gpu_offset_ns", "gpu_duration_ns", "nbytes",
)


@dataclass(slots=True)
class EncodedSteps:
    """A batch of steps as the local copy and the step table write them."""

    spans_json: list[str]
    """Per step, its spans' JSON joined by commas."""
    rows: list[str]
    """Per step, its CSV line."""
    spans: int
    """Spans in ``spans_json``."""


@dataclass(frozen=True, slots=True)
class _Shape:
    spans: str
    """All the step's spans, comma-joined, as one ``%`` template."""
    span_values: itemgetter  # type: ignore[type-arg]
    row: str
    row_values: itemgetter  # type: ignore[type-arg]
    table_slots: tuple[int | None, ...] | None
    """Per phase call, its slot in the table's per-phase columns (None: a phase without a column);
    None when no phase is called twice (each per-phase column is then one call's own value)."""


_REFERENCE = None  # a shape whose templates did not reproduce the reference: always the reference path


class StepLines:
    """Encodes steps for the local copy and the step table; one per rank, beside its span builder."""

    def __init__(self, builder: StepSpanBuilder) -> None:
        self._builder = builder
        self._run_id = builder.rank.run_id
        self._random_bits = builder.random_bits
        self._shapes: dict[tuple[object, ...], _Shape | None] = {}
        self.reference_steps = 0
        """Steps that took the reference path (the benchmarks and tests read it)."""

    def encode(self, records: Sequence[StepRecord]) -> EncodedSteps:
        """The JSON of each step's spans and its CSV line, in order."""
        spans_json: list[str] = []
        rows: list[str] = []
        spans = 0
        shapes = self._shapes
        bits = self._random_bits
        trace_id = c.step_trace_id
        run_id = self._run_id
        for record in records:
            if record.collectives or record.exception_type is not None or record.loader is not None \
                    or self._builder.first:
                spans += self._reference(record, spans_json, rows).count
                continue
            fields = _step_fields(record)
            phase_fields = list(map(_phase_fields, record.phases))
            flat = tuple(chain.from_iterable(phase_fields))
            key = (tuple(map(type, fields)), fields[9], fields[15], not fields[6], flat[::_PHASE_WIDTH],
                   tuple(map(type, flat)))
            shape = shapes.get(key, False)
            if not shape:
                built = self._reference(record, spans_json, rows)
                spans += built.count
                if shape is False and len(shapes) < SHAPE_LIMIT:
                    shapes[key] = _make_shape(key, record, built.spans, spans_json[-1], rows[-1])
                continue
            step_id = bits(64) or 1
            values = _values(fields, phase_fields, trace_id(run_id, fields[0]), step_id,
                             [bits(64) or 1 for _ in phase_fields])
            if shape.table_slots is not None:
                _add_sums(values, phase_fields, shape.table_slots)
            spans_json.append(shape.spans % shape.span_values(values))
            rows.append(shape.row % shape.row_values(values))
            spans += 1 + len(phase_fields)
        return EncodedSteps(spans_json, rows, spans)

    def _reference(self, record: StepRecord, spans_json: list[str], rows: list[str]) -> _Built:
        built = self._builder.build(record)
        spans = built.all()
        spans_json.append(",".join([span_json(span) for span in spans]))
        rows.append(csv_line(step_row(built)))
        self.reference_steps += 1
        return _Built(built, len(spans))


@dataclass(frozen=True, slots=True)
class _Built:
    spans: StepSpans
    count: int


_INTEGER_OR_NONE = (int, type(None))
_PARALLELISM, _SOURCE = 9, 15


def _make_shape(key: tuple[object, ...], record: StepRecord, built: StepSpans, reference_json: str,
                reference_row: str) -> _Shape | None:
    """Templates for the shape of ``record`` from its reference encoding; ``None`` (always the reference
    path) unless the filled templates give that encoding back byte for byte."""
    step_types, phase_types = key[0], key[5]
    numeric = [kind for i, kind in enumerate(step_types) if i not in (_PARALLELISM, _SOURCE)]
    if any(kind not in _INTEGER_OR_NONE for kind in numeric):
        return _REFERENCE  # floats or other kinds from a foreign trainer: the reference spells them
    if any(kind not in _INTEGER_OR_NONE for i, kind in enumerate(phase_types) if i % _PHASE_WIDTH):
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
    row = step_row(built)
    table_slots = [_PHASE_SLOT.get(phase.name) for phase in built.phases]
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
        value = row[column]
        if value is None:
            continue
        kind = type(value)
        spec = "%s" if value_index == _TRACE or kind is float else "%d" if kind is int else None
        if spec is None:
            return _REFERENCE
        slots.append((column, spec, value_index))
    row_text = row_template(row, [(column, spec) for column, spec, _ in slots])
    if row_text is None:
        return _REFERENCE
    shape = _Shape(
        spans=",".join(templates), span_values=itemgetter(*picks),
        row=row_text, row_values=_getter([value_index for _, _, value_index in slots]),
        table_slots=tuple(table_slots) if repeated else None,
    )
    fields = _step_fields(record)
    phase_fields = list(map(_phase_fields, record.phases))
    values = _values(fields, phase_fields, built.step.trace_id, built.step.span_id,
                     [phase.span_id for phase in built.phases])
    if shape.table_slots is not None:
        _add_sums(values, phase_fields, shape.table_slots)
    try:
        same = (shape.spans % shape.span_values(values) == reference_json
                and shape.row % shape.row_values(values) == reference_row)
    except (TypeError, ValueError, OverflowError):
        same = False
    return shape if same else _REFERENCE


def _getter(indices: list[int]) -> itemgetter:  # type: ignore[type-arg]
    """An ``itemgetter`` that always returns a tuple (one index alone would return the item)."""
    if len(indices) == 1:
        index = indices[0]
        return lambda values: (values[index],)  # type: ignore[return-value]
    return itemgetter(*indices)


def _values(fields: tuple[object, ...], phase_fields: list[tuple[object, ...]], trace_id: int, step_id: int,
            phase_ids: list[int]) -> list[object]:
    """One step's values in the flat layout the templates pick from: what the builder computes, with
    ids as hex text and each float as its ``repr`` text, made once for the JSON and the CSV line."""
    (step, start, end, gpu, wait, wait_gpu, fetches, prefetch, optimizer_steps, _, peak_allocated,
     peak_reserved, total, samples, tokens, _, between) = fields
    values: list[object] = [
        format(trace_id, "032x"), format(step_id, "016x"), start, end, step,
        repr((end - start) * _NS), optimizer_steps,  # type: ignore[operator]
        None if gpu is None else repr(gpu * _NS),  # type: ignore[operator]
        None if wait is None else repr(wait * _NS),  # type: ignore[operator]
        None if wait_gpu is None else repr(wait_gpu * _NS),  # type: ignore[operator]
        None if prefetch is None else repr(prefetch * _NS),  # type: ignore[operator]
        peak_allocated, peak_reserved, total,
        None if between is None else repr(between * _NS),  # type: ignore[operator]
        fetches, samples, tokens, *_NO_SUMS,
    ]
    if gpu is None:
        for (_, call, phase_start, phase_end, _, phase_gpu, nbytes), phase_id in zip(
                phase_fields, phase_ids, strict=True):
            values += (format(phase_id, "016x"), phase_start, phase_end, call,
                       repr((phase_end - phase_start) * _NS),  # type: ignore[operator]
                       None if phase_gpu is None else repr(phase_gpu * _NS), nbytes)  # type: ignore[operator]
        return values
    ends = []
    for (_, call, phase_start, phase_end, offset, phase_gpu, nbytes), phase_id in zip(
            phase_fields, phase_ids, strict=True):
        cpu_text = repr((phase_end - phase_start) * _NS)  # type: ignore[operator]
        gpu_text = None
        if phase_gpu is not None:
            gpu_text = repr(phase_gpu * _NS)  # type: ignore[operator]
            if offset is not None:  # on the device's timeline
                phase_start = start + offset  # type: ignore[operator]
                phase_end = phase_start + phase_gpu  # type: ignore[operator]
        values += (format(phase_id, "016x"), phase_start, phase_end, call, cpu_text, gpu_text, nbytes)
        ends.append(phase_end)
    values[_END] = max(end, start + gpu, *ends)  # type: ignore[operator]
    return values


_NO_SUMS = (None,) * (2 * len(c.PHASES))


def _add_sums(values: list[object], phase_fields: list[tuple[object, ...]],
              table_slots: tuple[int | None, ...]) -> None:
    """The table's per-phase sums (cpu, gpu) of a step that calls a phase more than once, added from
    0.0 in call order as the table's reference adds them."""
    sums = [0.0] * len(_NO_SUMS)
    for (_, _, phase_start, phase_end, _, phase_gpu, _), slot in zip(phase_fields, table_slots, strict=True):
        if slot is not None:
            sums[slot] += (phase_end - phase_start) * _NS  # type: ignore[operator]
            if phase_gpu is not None:
                sums[len(c.PHASES) + slot] += phase_gpu * _NS  # type: ignore[operator]
    values[_CPU_SUMS:_CPU_SUMS + len(sums)] = [repr(total) for total in sums]
