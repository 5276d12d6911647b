"""A step's local-copy spans and step-table row straight from its step row.

Neither the local copy nor the step table needs span objects, and with no OTLP endpoint and no
metrics (the default) they are the emitter's only outputs. Decoding each step row into a
:class:`~traceml_otel.step_records.StepRecord`, building spans from it (an attribute dict and a
``SpanData`` each) and walking them twice (JSON, CSV) was most of the emitter's CPU; now the record
and spans are built only for OTLP export and metrics (``keep_spans``), with the ids the text already
has. Each step *shape* (which optional values the row has and of which types, its parallelism,
source and phase sequence) gets two ``%`` templates: the JSON of all its spans, with every value that
repeats within the shape (run id, rank, host, names, clock) written in, and its CSV line. Later rows
of the shape only fill in their ids and numbers, read from the rows' slots
(:class:`~traceml_otel.wire.step_row.StepRow`).

A run of rows of one shape (a trainer's batch usually is one) is encoded a column at a time: the
shape is confirmed by comparing lists over all the rows at once, each value (times, durations' text,
hex ids) is made by ``map`` over its column, and the run's text is one ``join`` of the templates'
constant pieces and the values' text. Per step that is C loops instead of a Python function and a
``%`` scan of a 2.6 KB template.

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

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, groupby, repeat
from operator import add, itemgetter, mul, not_, sub
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.local_copy import span_json, span_template
from traceml_otel.emit.spans import StepSpanBuilder, StepSpans
from traceml_otel.emit.step_table import PHASE_SLOT, csv_line, row_template, step_row
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.frames import orjson_module
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
    """The steps' spans' JSON in chunks of one or more steps, comma-joined within a chunk (and to be
    comma-joined between chunks)."""
    rows: list[str]
    """The steps' CSV lines in chunks of one or more lines."""
    spans: int
    """Spans in ``spans_json``."""
    steps: int = 0
    """Steps in ``spans_json`` (and lines in ``rows``)."""
    records: list[StepRecord] = field(default_factory=list)
    built: list[StepSpans] = field(default_factory=list)
    """With ``keep_spans``: each step's record and its span objects, with the ids its text has."""


@dataclass(frozen=True, slots=True)
class _Text:
    """A text with slots, filled for many steps by one ``join``: the text before the first slot, the
    constant text after each slot (after the last: joined to the next step's head by the separator),
    and the flat layout's index each slot takes."""

    head: str
    between: tuple[str, ...]
    tail: str
    picks: tuple[int, ...]

    @classmethod
    def of(cls, template: str, picks: list[int], separator: str) -> _Text | None:
        """From a ``%`` template whose ``%s``/``%d`` slots take ``picks``; ``None`` for any other."""
        pieces = _SPEC.split(template)  # text, spec, text, spec, ..., text
        constants = [pieces[0]]
        for spec, text in zip(pieces[1::2], pieces[2::2], strict=True):
            if spec == "%":
                constants[-1] += "%" + text
            elif spec in ("s", "d"):
                constants.append(text)
            else:
                return None
        if len(constants) != len(picks) + 1 or not picks:
            return None
        return cls(constants[0], (*constants[1:-1], constants[-1] + separator + constants[0]), constants[-1],
                   tuple(picks))

    def fill(self, texts: list[Any]) -> str:
        """Every step's text, separated, from the columns of value texts the slots pick."""
        values = list(chain.from_iterable(zip(*[texts[i] for i in self.picks], strict=True)))
        parts: list[str] = [self.head] * (2 * len(values) + 1)
        parts[1::2] = values
        parts[2::2] = self.between * (len(values) // len(self.picks))
        parts[-1] = self.tail
        return "".join(parts)


_SPEC = re.compile(r"%(.)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Shape:
    spans: _Text
    """All the step's spans, comma-joined; steps joined by commas."""
    row: _Text
    """The step's CSV line; lines joined as they are."""
    integers: tuple[int, ...]
    """The flat layout's indices both texts pick whose values are integers (written by ``str``)."""
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
        out = EncodedSteps([], [], 0)
        rows = list(rows)
        if rows and self._builder.first:  # the first step span carries the host's CPU count
            self._reference(rows[0], anchor_ns, out, keep_spans)
            rows = rows[1:]
        for key, run, columns in _runs(rows):
            shape = False if key is None else self._shapes.get(key, False)
            if shape is False and key is not None and len(self._shapes) < SHAPE_LIMIT:
                built = self._reference(run[0], anchor_ns, out, keep_spans)
                shape = self._shapes[key] = _make_shape(key, run[0], anchor_ns, built.spans,
                                                        out.spans_json[-1], out.rows[-1])
                run, columns = run[1:], None
            if not shape:
                for row in run:
                    self._reference(row, anchor_ns, out, keep_spans)
                continue
            if run:
                self._encode_run(shape, run, columns or _StepColumns.of(run), anchor_ns, out, keep_spans)
        return out

    def _encode_run(self, shape: _Shape, rows: list[Any], columns: _StepColumns, anchor_ns: int,
                    out: EncodedSteps, keep_spans: bool) -> None:
        """Rows of one templated shape, a column at a time: each value is computed by ``map`` over
        the run (C loops), then the run's text is one ``join`` of constants and value texts."""
        calls = len(columns.phases)
        bits = self._random_bits
        ids = [bits(64) or 1 for _ in range(len(rows) * (1 + calls))]  # the builder's order, per step
        step_ids = ids[::1 + calls]
        phase_ids = [ids[1 + i::1 + calls] for i in range(calls)]
        trace_ids = list(map(c.step_trace_id, repeat(self._run_id), columns.step[0]))
        texts = _texts(_flat_columns(columns, anchor_ns, trace_ids, step_ids, phase_ids, shape.table_slots),
                       shape.integers)
        out.spans_json.append(shape.spans.fill(texts))
        out.rows.append(shape.row.fill(texts))
        out.spans += len(rows) * (1 + calls)
        out.steps += len(rows)
        if keep_spans:
            for k, row in enumerate(rows):
                record = decode_step(row, anchor_ns)
                out.records.append(record)
                out.built.append(self._builder.build(record, (step_ids[k], [ids[k] for ids in phase_ids])))

    def _reference(self, row: Any, anchor_ns: int, out: EncodedSteps, keep_spans: bool) -> _Built:
        record = decode_step(row, anchor_ns)
        built = self._builder.build(record)
        spans = built.all()
        out.spans_json.append(",".join([span_json(span) for span in spans]))
        out.rows.append(csv_line(step_row(built)))
        out.spans += len(spans)
        out.steps += 1
        if keep_spans:
            out.records.append(record)
            out.built.append(built)
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
    spans_text = _Text.of(",".join(templates), picks, ",")
    row_text = _Text.of(line, [value_index for _, _, value_index in slots], "")
    if spans_text is None or row_text is None:
        return _REFERENCE
    sums = tuple(table_slots) if repeated else None
    try:  # the columns this shape's later runs are encoded from, for this one row
        flat = _flat_columns(_StepColumns.of([row]), anchor_ns, [built.step.trace_id], [built.step.span_id],
                             [[phase.span_id] for phase in built.phases], sums)
        integers = tuple(sorted({i for i in (*spans_text.picks, *row_text.picks) if type(flat[i][0]) is int}))
        shape = _Shape(spans_text, row_text, integers, sums)
        texts = _texts(flat, integers)
        same = shape.spans.fill(texts) == reference_json and shape.row.fill(texts) == reference_line
    except (TypeError, ValueError, OverflowError, IndexError):
        return _REFERENCE
    return shape if same else _REFERENCE


def _texts(flat: list[Any], integers: tuple[int, ...]) -> list[Any]:
    """``flat`` with the integer columns the texts pick written as text (each column once, however
    many slots take it)."""
    texts = list(flat)
    for i in integers:
        texts[i] = list(map(repr, flat[i]))  # an int's repr is its str, made with less dispatch
    return texts


def _runs(rows: list[Any]) -> list[tuple[tuple[object, ...] | None, list[Any], _StepColumns | None]]:
    """``rows`` as runs of consecutive rows of one shape key (``None``: rows that always take the
    reference path), with the run's columns when they were made on the way. A batch is usually one
    shape, which a check a column at a time confirms; otherwise each row's key is computed."""
    if not rows:
        return []
    key = _key(rows[0])
    columns = None if key is None else _one_shape(rows, key)
    if columns is not None:
        return [(key, rows, columns)]
    return [(key, list(run), None) for key, run in groupby(rows, _key)]


def _key(row: Any) -> tuple[object, ...] | None:
    try:
        return _shape_key(row)
    except (TypeError, ValueError, IndexError):
        return None  # not a row the fast path reads: the decoder says what is wrong with it


def _one_shape(rows: list[Any], key: tuple[object, ...]) -> _StepColumns | None:
    """The run's columns when every row's :func:`_shape_key` is ``key``, checked a column at a time
    (only for keys whose phase calls all have the full width: the others are never templated);
    ``None`` when some row's is not (or may not be)."""
    row_types, parallelism, source, no_fetches, phase_lengths, names, phase_types = key
    if any(length != _PHASE_WIDTH for length in phase_lengths):  # type: ignore[attr-defined]
        return None
    steps = len(rows)
    try:
        if (list(map(type, rows)) != [list] * steps or list(map(len, rows)) != [ROW_FIELDS] * steps
                or list(map(type, chain.from_iterable(rows))) != list(row_types) * steps):  # type: ignore[call-overload]
            return None
        step = list(zip(*rows, strict=True))
        if (step[_ROW_PARALLELISM].count(parallelism) != steps or step[_ROW_SOURCE].count(source) != steps
                or list(map(not_, step[_ROW_FETCHES])) != [no_fetches] * steps
                or any(step[_ROW_COLLECTIVES]) or any(step[_ROW_LOADER])):
            return None
        if step[_ROW_BETWEEN][0] is not None and min(step[_ROW_BETWEEN]) < 0:
            return None
        calls = len(phase_lengths)  # type: ignore[arg-type]
        if list(map(len, step[_ROW_PHASES])) != [calls] * steps:
            return None
        phase_rows = list(chain.from_iterable(step[_ROW_PHASES]))  # step by step, call by call
        if (list(map(len, phase_rows)) != [_PHASE_WIDTH] * len(phase_rows)
                or list(map(type, chain.from_iterable(phase_rows))) != list(phase_types) * steps  # type: ignore[call-overload]
                or list(map(itemgetter(0), phase_rows)) != list(names) * steps):  # type: ignore[call-overload]
            return None
    except (TypeError, ValueError):
        return None  # incomparable values: each row's own key says what it is
    return _StepColumns(step, phase_rows, calls)


class _StepColumns:
    """A run's rows as columns: each step slot's values, and each phase call's slots' values."""

    __slots__ = ("phases", "step")

    def __init__(self, step: list[tuple[Any, ...]], phase_rows: list[Any], calls: int) -> None:
        self.step = step
        self.phases: list[list[tuple[Any, ...]]] = [
            list(zip(*phase_rows[i::calls], strict=True)) for i in range(calls)]

    @classmethod
    def of(cls, rows: list[Any]) -> _StepColumns:
        """Rows of one shape (each row's key computed): the same number of phase calls each."""
        step = list(zip(*rows, strict=True))
        calls = len(step[_ROW_PHASES][0])
        return cls(step, list(chain.from_iterable(step[_ROW_PHASES])), calls)


def _seconds(nanoseconds: Iterable[int]) -> list[str]:
    """Each duration in seconds as its ``repr`` text (the shortest round trip, as JSON writes it).

    ``repr`` of a float is costly (CPython's exact ``dtoa``, about 4,000 instructions). Where every
    value lies where ``repr`` writes plain decimals (1e-4 <= |x| < 1e16), ``orjson`` writes the same
    digits (also the shortest round trip) in one C call for the whole column; below 1e-4 ``repr``
    writes an exponent (``5.6e-05``) that ``orjson`` spells otherwise (``0.000056``), so such a column
    takes ``repr`` (rewriting orjson's text in Python cost more than ``repr``).
    ``tests/emit/test_step_lines.py`` compares the result with ``repr`` on a third of a million values."""
    values = list(map(mul, nanoseconds, repeat(_NS)))
    fast = orjson_module()
    if fast is not None and values and min(map(abs, values)) >= 1e-4 and max(map(abs, values)) < 1e16:
        texts = fast.dumps(values)[1:-1].decode().split(",")
        if texts[0] == repr(values[0]):  # one value checked per column, in case orjson ever differs
            return texts
    return list(map(repr, values))


def _hex(ids: Iterable[int], spec: str) -> list[str]:
    """Each id as fixed-width hex text (``spec``: ``%016x`` or ``%032x``)."""
    return list(map(spec.__mod__, ids))


def _flat_columns(columns: _StepColumns, anchor_ns: int, trace_ids: list[int], step_ids: list[int],
                  phase_ids: list[list[int]], table_slots: tuple[int | None, ...] | None) -> list[Any]:
    """A run's values, one column per slot of the flat layout the templates pick from: what the
    decoder and the builder compute for each row, with ids as hex text and each float as its
    ``repr`` text. A run has one shape, so a slot is ``None`` in every row or in none (a ``None``
    column is never picked: its attribute or cell is absent)."""
    (step, start, end, gpu, wait, wait_gpu, fetches, prefetch, optimizer_steps, _, peak_allocated,
     peak_reserved, total, _, _, _, samples, tokens, _, _, between) = columns.step
    starts = list(map(add, start, repeat(anchor_ns)))
    ends = list(map(add, end, repeat(anchor_ns)))
    on_gpu = gpu[0] is not None
    flat: list[Any] = [
        _hex(trace_ids, "%032x"), _hex(step_ids, "%016x"), starts, ends, step, _seconds(map(sub, end, start)),
        optimizer_steps, _optional_seconds(gpu), _optional_seconds(wait), _optional_seconds(wait_gpu),
        _optional_seconds(prefetch), peak_allocated, peak_reserved, total, _optional_seconds(between),
        fetches, samples, tokens, *_NO_SUMS,
    ]
    phase_ends = []
    for (_, call, phase_start, phase_end, offset, phase_gpu, nbytes), ids in zip(
            columns.phases, phase_ids, strict=True):
        cpu_text = _seconds(map(sub, phase_end, phase_start))
        if on_gpu and phase_gpu[0] is not None and offset[0] is not None:  # on the device's timeline
            phase_starts = list(map(add, starts, offset))
            phase_ends.append(list(map(add, phase_starts, phase_gpu)))
        else:
            phase_starts = list(map(add, phase_start, repeat(anchor_ns)))
            phase_ends.append(list(map(add, phase_end, repeat(anchor_ns))))
        flat += (_hex(ids, "%016x"), phase_starts, phase_ends[-1], call, cpu_text,
                 _optional_seconds(phase_gpu), nbytes)
    if on_gpu:
        flat[_END] = list(map(max, ends, map(add, starts, gpu), *phase_ends))
    if table_slots is not None:
        flat[_CPU_SUMS:_CPU_SUMS + len(_NO_SUMS)] = _phase_sums(columns, table_slots)
    return flat


def _optional_seconds(nanoseconds: tuple[int | None, ...]) -> list[str] | None:
    return None if nanoseconds[0] is None else _seconds(nanoseconds)


_NO_SUMS = (None,) * (2 * len(c.PHASES))


def _phase_sums(columns: _StepColumns, table_slots: tuple[int | None, ...]) -> list[list[str]]:
    """The table's per-phase sums (cpu, then gpu) of steps that call a phase more than once, added
    from 0.0 in call order as the table's reference adds them, as ``repr`` text."""
    steps = len(columns.step[0])
    sums: list[Iterable[float]] = [[0.0] * steps for _ in _NO_SUMS]
    for (_, _, phase_start, phase_end, _, phase_gpu, _), slot in zip(columns.phases, table_slots,
                                                                      strict=True):
        if slot is not None:
            sums[slot] = list(map(add, sums[slot], map(mul, map(sub, phase_end, phase_start), repeat(_NS))))
            if phase_gpu[0] is not None:
                gpu_slot = len(c.PHASES) + slot
                sums[gpu_slot] = list(map(add, sums[gpu_slot], map(mul, phase_gpu, repeat(_NS))))
    return [list(map(repr, column)) for column in sums]
