"""A step's local-copy spans and step-table row straight from its step row.

Neither the local copy nor the step table needs span objects (with no OTLP endpoint and no metrics, the
default, they are the emitter's only outputs): records and spans are built only for OTLP export and
metrics (``keep_spans``), with the ids the text already has. Each step *shape* (which optional values
the row has and of which types, its parallelism, source and phase sequence) gets two ``%`` templates:
the JSON of all its spans, with every value that repeats within the shape (run id, rank, host, names,
clock) written in, and its CSV line. Later rows of the shape only fill in their ids and numbers, read
from the rows' slots (:class:`~traceml_otel.wire.step_row.StepRow`).

A run of rows of one shape (a trainer's batch usually is one) is encoded a column at a time: the
shape is confirmed by comparing lists over all the rows at once
(:func:`~traceml_otel.emit.step_shapes.one_shape`), then :mod:`traceml_otel.emit.step_columns`
makes each value's text by ``map`` over its column and fills the run's text by one ``join``.

Exactness. A shape's templates are made from the reference path's output for its first row
(:func:`~traceml_otel.wire.step_row.decode_step`, :class:`~traceml_otel.emit.spans.StepSpanBuilder`,
:func:`~traceml_otel.emit.local_copy.span_json`, :func:`~traceml_otel.emit.step_table.step_row`),
then filled with that row's values; unless both give the reference text byte for byte, the shape
always takes the reference path. Rows whose output depends on more than their shape take the
reference path every time: an exception (a span status), a newly seen DataLoader, the rank's first
step (the host's CPU count), a negative time between steps (decoded as unknown), and a row of
another layout (a shorter or longer row or phase row, which the decoder pads or cuts). Span ids come
from the builder's generator in the builder's order.

Steps with collectives (DDP's): their communication values fill extra columns, worked out a column at
a time for a steady DDP segment (:mod:`traceml_otel.emit.bucket_runs`), else per step by the span
builder's functions (:mod:`traceml_otel.emit.step_collectives`); their signature completes the key.
``tests/emit/test_step_lines.py`` and ``test_step_collectives.py`` compare the paths on random rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.bucket_runs import bucket_segments
from traceml_otel.emit.local_copy import span_json, span_template
from traceml_otel.emit.otlp_encode import SpanEncoder
from traceml_otel.emit.spans import StepSpanBuilder, StepSpans
from traceml_otel.emit.step_collectives import (
    LIST_KEYS,
    PHASE_KEYS,
    STEP_KEYS,
    CollectiveLayout,
    StepParts,
    collective_spans,
    collective_templates,
    parts_of,
    signature,
    step_parts,
)
from traceml_otel.emit.step_columns import (
    CPU_DURATION,
    CPU_SUMS,
    END,
    FIRST_NUMBER,
    FIRST_PHASE,
    GPU_SUMS,
    NUMBERS,
    ROW_PHASES,
    START,
    STEP,
    STEP_ID,
    TRACE,
    SlotText,
    StepColumns,
    flat_columns,
    span_id_texts,
    value_texts,
)
from traceml_otel.emit.step_protobuf import EncodedStep, PendingFill, StepProtobuf
from traceml_otel.emit.step_run import StepRun
from traceml_otel.emit.step_shapes import PLAIN_KEY, runs
from traceml_otel.emit.step_table import PHASE_SLOT, csv_line, row_template, step_row
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.step_row import decode_step
from traceml_otel.wire.step_schema import PHASE_WIDTH, STEP_FIELDS
from traceml_otel.wire.step_table import COLUMNS

_COMM_COLUMN = COLUMNS.index("comm_calls")
"""The step table's first communication column (emit/step_collectives.py's layout fills them)."""

SHAPE_LIMIT = 256
"""Shapes templated per rank; steps of further shapes take the reference path."""

# Where each value lies in the flat layout (emit/step_columns.py) the templates pick from: the step's
# number and CPU duration, then the schema's numbers (step_columns.NUMBERS).
_STEP_VALUES = {
    c.ATTR_STEP: STEP, c.ATTR_STEP_CPU_DURATION: CPU_DURATION,
    **{f.attribute: FIRST_NUMBER + i for i, f in enumerate(NUMBERS) if f.attribute},
}
_PHASE_ID, _PHASE_START, _PHASE_END = 0, 1, 2
_PHASE_VALUES = {c.ATTR_PHASE_CALL: 3, c.ATTR_PHASE_CPU_DURATION: 4, c.ATTR_PHASE_GPU_DURATION: 5,
                 c.ATTR_H2D_BYTES: 6}
_STEP_VARIABLE = frozenset(_STEP_VALUES)
_PHASE_VARIABLE = frozenset([c.ATTR_STEP, *_PHASE_VALUES])

_TABLE_VALUES = {
    "step": STEP, "trace_id": TRACE, "start_unix_nano": START, "traced_cpu": CPU_DURATION,
    **{f.column: FIRST_NUMBER + i for i, f in enumerate(NUMBERS) if f.column},
    **{f"cpu_{phase}": CPU_SUMS + i for i, phase in enumerate(c.PHASES)},
    **{f"gpu_{phase}": GPU_SUMS + i for i, phase in enumerate(c.PHASES)},
}
_TABLE_SLOTS = [(COLUMNS.index(name), value) for name, value in _TABLE_VALUES.items()]

_ROW_NOT_NUMBERS = frozenset(f.slot for f in STEP_FIELDS if f.kind is not int)

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
    records: list[StepRecord | None] = field(default_factory=list)
    built: list[StepSpans | EncodedStep] = field(default_factory=list)
    """With ``keep_spans``: each step's record and its span objects, with the ids its text has; a
    templated shape's steps as :class:`EncodedStep` instead (their spans' OTLP protobuf, when
    :attr:`StepLines.otlp` is set, and the ids). Without the span budget a templated run's records
    are left to its :class:`~traceml_otel.emit.step_run.StepRun` (``None`` here, the run on the
    ``EncodedStep``: :func:`~traceml_otel.emit.step_run.resolve_records` decodes them)."""


@dataclass(frozen=True, slots=True)
class _Shape:
    spans: SlotText
    """All the step's spans, comma-joined; steps joined by commas."""
    row: SlotText
    """The step's CSV line; lines joined as they are."""
    integers: tuple[int, ...]
    """The flat layout's indices both texts pick whose values are integers (written as their decimal
    text, ``str``'s: see ``step_columns.value_texts``)."""
    table_slots: tuple[int | None, ...] | None
    """Per phase call, its slot in the table's per-phase columns (None: a phase without a column);
    None when no phase is called twice (each per-phase column is then one call's own value)."""
    protobuf: StepProtobuf | None = None
    """The spans' OTLP protobuf template (None: no OTLP export, or the shape's spans are built)."""
    layout: CollectiveLayout | None = None
    """A shape with collectives: where its communication values lie in the flat layout."""


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
        self.bucket_steps = 0
        """DDP steps whose values were worked out a column at a time (:mod:`.bucket_runs`; tests)."""
        self.otlp: SpanEncoder | None = None
        """OTLP span export's encoder: set, templated steps come with their spans' protobuf
        (:mod:`traceml_otel.emit.step_protobuf`); shapes are templated for it from then on."""
        self.defer_protobuf = False
        """Set (the span budget is on): a templated step's protobuf waits for the budget's decision
        (:func:`~traceml_otel.emit.step_protobuf.fill_kept`), so the steps it drops are never filled."""

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
        for key, run, columns in runs(rows):
            if key is not None and len(key) > len(PLAIN_KEY):
                self._collective_rows(key, run, anchor_ns, out, keep_spans, columns)
                continue
            shape = False if key is None else self._shapes.get(key, False)
            if shape is False and key is not None and len(self._shapes) < SHAPE_LIMIT:
                built = self._reference(run[0], anchor_ns, out, keep_spans)
                shape = self._shapes[key] = _make_shape(key, run[0], anchor_ns, built,
                                                        out.spans_json[-1], out.rows[-1], self.otlp)
                run, columns = run[1:], None
            if not shape:
                for row in run:
                    self._reference(row, anchor_ns, out, keep_spans)
                continue
            if run:
                self._encode_run(shape, run, columns or StepColumns.of(run), anchor_ns, out, keep_spans)
        return out

    def _collective_rows(self, key: tuple[object, ...], rows: list[Any], anchor_ns: int, out: EncodedSteps,
                         keep_spans: bool, columns: StepColumns | None = None) -> None:
        """Rows with collectives: a steady DDP segment's values a column at a time
        (:mod:`traceml_otel.emit.bucket_runs`; decoded only for span objects or OTLP) when its shape
        is templated, else :meth:`_step_rows`."""
        for run, records, parts in bucket_segments(key, rows, anchor_ns, decode_step if keep_spans else None,
                                                   lambda: self._builder.last_exit_ns):
            known = None if parts is None else self._shapes.get((*key, signature(parts[0])))
            if isinstance(known, _Shape) and parts is not None:
                self._builder.last_exit_ns = parts[-1].last_exit_ns
                whole = columns if len(run) == len(rows) else None
                self._encode_run(known, run, whole or StepColumns.of(run), anchor_ns, out, keep_spans, parts)
                self.bucket_steps += len(run)
            else:
                self._step_rows(key, run, records, anchor_ns, out, keep_spans)

    def _step_rows(self, key: tuple[object, ...], rows: list[Any], records: list[StepRecord] | None,
                   anchor_ns: int, out: EncodedSteps, keep_spans: bool) -> None:
        """One at a time in order: each one's values (:mod:`traceml_otel.emit.step_collectives`) complete
        its shape; consecutive rows of one templated shape are encoded as a run, the others by the
        reference path (``records``: the rows decoded already, or ``None``)."""
        run: list[Any] = []
        run_parts: list[StepParts] = []
        run_shape: _Shape | None = None

        def flush() -> None:
            if run_shape is not None and run:
                self._encode_run(run_shape, run, StepColumns.of(run), anchor_ns, out, keep_spans, run_parts)
            run.clear()
            run_parts.clear()

        for i, row in enumerate(rows):
            previous = self._builder.last_exit_ns
            try:
                parts = step_parts(decode_step(row, anchor_ns) if records is None else records[i], previous)
                full = None if parts is None else (*key, signature(parts))
                shape = False if full is None else self._shapes.get(full, False)
            except (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError):
                full, shape = None, False  # the reference path says what is wrong with it
            if shape is False and full is not None and len(self._shapes) < SHAPE_LIMIT:
                flush()
                built = self._reference(row, anchor_ns, out, keep_spans)
                self._shapes[full] = _make_shape(full, row, anchor_ns, built, out.spans_json[-1],
                                                 out.rows[-1], self.otlp)
                continue
            if not isinstance(shape, _Shape) or parts is None:
                flush()
                self._reference(row, anchor_ns, out, keep_spans)
                continue
            if shape is not run_shape:
                flush()
                run_shape = shape
            run.append(row)
            run_parts.append(parts)
            self._builder.last_exit_ns = parts.last_exit_ns
        flush()

    def _encode_run(self, shape: _Shape, rows: list[Any], columns: StepColumns, anchor_ns: int,
                    out: EncodedSteps, keep_spans: bool, parts: list[StepParts] | None = None) -> None:
        """Rows of one templated shape, a column at a time: each value is computed by ``map`` over
        the run (C loops), then the run's text is one ``join`` of constants and value texts. A shape
        with collectives takes their values from ``parts`` (each row's, worked out already)."""
        calls = len(columns.phases)
        layout = shape.layout
        groups = 0 if layout is None else len(layout.ids)
        stride = 1 + calls + groups
        ids = span_id_texts(self._random_bits, len(rows) * stride)  # the builder's order, per step
        step_ids = ids[::stride]
        phase_ids = [ids[1 + i::stride] for i in range(calls)]
        trace_ids = c.step_trace_ids_hex(self._run_id, columns.step[0])
        flat = flat_columns(columns, anchor_ns, trace_ids, step_ids, phase_ids, shape.table_slots)
        group_ids: list[list[str]] = []
        if layout is not None:
            assert parts is not None
            group_ids = [ids[1 + calls + g::stride] for g in range(groups)]
            encode = None if self.otlp is None else self.otlp.attribute_fields
            flat += layout.columns(parts, group_ids, encode)
        texts = value_texts(flat, shape.integers)
        out.spans_json.append(shape.spans.fill(texts))
        out.rows.append(shape.row.fill(texts))
        out.spans += len(rows) * stride
        out.steps += len(rows)
        if not keep_spans:
            return
        lazy = parts is None and not self.defer_protobuf and (self.otlp is None or shape.protobuf is not None)
        if lazy:  # the metrics and the time account read the run's columns (emit/step_run.py)
            run = StepRun(rows, anchor_ns, columns)
            encoded = shape.protobuf.fill(flat) if shape.protobuf is not None else repeat(())
            out.records += [None] * len(rows)
            out.built += map(EncodedStep, map(int, trace_ids, repeat(16)), map(int, step_ids, repeat(16)),
                             repeat(stride), encoded, repeat(()), repeat(None), range(len(rows)), repeat(run))
            return
        if parts is None:
            _number_calls(rows, flat, calls)  # the decoder's per-row numbering, done once for the run
        if self.otlp is None or shape.protobuf is not None:  # no span objects: ids, and the protobuf
            if parts is None:
                out.records += [decode_step(row, anchor_ns) for row in rows]
                collectives: Any = repeat(())
            else:
                out.records += [one.record for one in parts]
                collectives = collective_spans(parts, self._builder.rank, trace_ids, step_ids, group_ids)
            if shape.protobuf is not None and self.defer_protobuf:  # filled once the budget keeps a step
                out.built += map(EncodedStep, map(int, trace_ids, repeat(16)), map(int, step_ids, repeat(16)),
                                 repeat(stride), repeat(()), collectives,
                                 repeat(PendingFill(shape.protobuf, flat)), range(len(rows)))
                return
            encoded = shape.protobuf.fill(flat) if shape.protobuf is not None else repeat(())
            out.built += map(EncodedStep, map(int, trace_ids, repeat(16)), map(int, step_ids, repeat(16)),
                             repeat(stride), encoded, collectives)
            return
        last_exit = self._builder.last_exit_ns
        for k, row in enumerate(rows):
            if parts is None:
                record = decode_step(row, anchor_ns)
                collective_ids = None
            else:  # the builder works the wait entries out again, from the same previous exit
                record = parts[k].record
                self._builder.last_exit_ns = parts[k].previous_exit_ns
                collective_ids = [int(column[k], 16) for column in group_ids]
            out.records.append(record)
            out.built.append(self._builder.build(
                record, (int(step_ids[k], 16), [int(ids[k], 16) for ids in phase_ids]), collective_ids))
        self._builder.last_exit_ns = last_exit

    def _reference(self, row: Any, anchor_ns: int, out: EncodedSteps, keep_spans: bool) -> StepSpans:
        """One row by the reference path (decode, span objects, their JSON and CSV line)."""
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
        return built


def _number_calls(rows: list[Any], flat: list[Any], calls: int) -> None:
    """Write each unnumbered phase call's number (the run's, from its flat layout) into the run's rows,
    as :func:`~traceml_otel.wire.step_row.decode_step` would for each row (1.4 us a step less)."""
    for i in range(calls):
        if rows[0][ROW_PHASES][i][1] is None:  # a run's rows agree on which calls are unnumbered
            number = flat[FIRST_PHASE + i * PHASE_WIDTH + _PHASE_VALUES[c.ATTR_PHASE_CALL]][0]
            try:
                for row in rows:
                    row[ROW_PHASES][i][1] = number
            except TypeError:  # a phase row that is not a list: the decoder numbers it
                return


_INTEGER_OR_NONE = (int, type(None))


def _make_shape(key: tuple[object, ...], row: list[Any], anchor_ns: int, built: StepSpans,
                reference_json: str, reference_line: str, otlp: SpanEncoder | None = None) -> _Shape | None:
    """Templates for the shape of ``row`` from its reference encoding; ``None`` (always the reference
    path) unless the filled templates give that encoding back byte for byte."""
    row_types, phase_lengths, phase_types = key[0], key[3], key[5]
    if any(kind not in _INTEGER_OR_NONE for i, kind in enumerate(row_types) if i not in _ROW_NOT_NUMBERS):
        return _REFERENCE  # floats or other kinds from a foreign trainer: the reference spells them
    if any(length != PHASE_WIDTH for length in phase_lengths):  # type: ignore[attr-defined]
        return _REFERENCE
    if any(kind not in _INTEGER_OR_NONE for i, kind in enumerate(phase_types) if i % PHASE_WIDTH):
        return _REFERENCE
    layout = None
    if built.collectives:  # a DDP step: its communication values lie after the phase calls' slots
        layout = CollectiveLayout(FIRST_PHASE + len(built.phases) * PHASE_WIDTH, parts_of(built),
                                  [phase.name for phase in built.phases])
        if len(key) <= len(PLAIN_KEY) or key[-1] != signature(parts_of(built)):
            return _REFERENCE  # (the row's values and its spans must agree on the shape)
    step = span_template(built.step, _STEP_VARIABLE | STEP_KEYS, LIST_KEYS)
    if step is None:
        return _REFERENCE
    step_layout = {} if layout is None else layout.step
    if any(k not in _STEP_VALUES and k not in step_layout for k in step[1]):
        return _REFERENCE
    picks = [TRACE, STEP_ID, START, END, *(_STEP_VALUES[k] if k in _STEP_VALUES else step_layout[k]
                                            for k in step[1])]
    templates = [step[0]]
    span_picks, span_keys = [list(picks)], [step[1]]  # per span, for the protobuf template
    protobuf_picks = [[*picks[:4], *(_STEP_VALUES[k] if k in _STEP_VALUES  # a list attribute's protobuf
                                     else step_layout[k] + (k in LIST_KEYS)  # field: the next column
                                     for k in step[1])]]
    for i, phase in enumerate(built.phases):
        made = span_template(phase, _PHASE_VARIABLE | PHASE_KEYS)
        if made is None:
            return _REFERENCE
        base = FIRST_PHASE + i * PHASE_WIDTH
        templates.append(made[0])
        phase_layout = {} if layout is None else layout.phases[i]
        if any(k in PHASE_KEYS and k not in phase_layout for k in made[1]):
            return _REFERENCE
        values = [_STEP_VALUES[k] if k == c.ATTR_STEP else phase_layout[k] if k in PHASE_KEYS
                  else base + _PHASE_VALUES[k] for k in made[1]]
        span_picks.append([TRACE, base + _PHASE_ID, STEP_ID, base + _PHASE_START, base + _PHASE_END, *values])
        protobuf_picks.append(span_picks[-1])
        span_keys.append(made[1])
        picks += span_picks[-1]
    if layout is not None:
        collectives = collective_templates(built, layout)
        if collectives is None:
            return _REFERENCE
        for text, collective_picks, keys in collectives:
            templates.append(text)
            span_picks.append(collective_picks)
            protobuf_picks.append(collective_picks)
            span_keys.append(keys)
            picks += collective_picks
    table_row = step_row(built)
    table_slots = [PHASE_SLOT.get(phase.name) for phase in built.phases]
    repeated = any(table_slots.count(slot) > 1 for slot in table_slots if slot is not None)
    own_value = {}  # a per-phase column of one call: that call's own value
    if not repeated:
        for i, slot in enumerate(table_slots):
            if slot is not None:
                base = FIRST_PHASE + i * PHASE_WIDTH
                own_value[CPU_SUMS + slot] = base + _PHASE_VALUES[c.ATTR_PHASE_CPU_DURATION]
                own_value[GPU_SUMS + slot] = base + _PHASE_VALUES[c.ATTR_PHASE_GPU_DURATION]
    slots = []
    for column, value_index in sorted(_TABLE_SLOTS):
        value_index = own_value.get(value_index, value_index)
        value = table_row[column]
        if value is None:
            continue
        kind = type(value)
        spec = "%s" if value_index == TRACE or kind is float else "%d" if kind is int else None
        if spec is None:
            return _REFERENCE
        slots.append((column, spec, value_index))
    if layout is not None:  # the communication columns: the layout's cells
        for j in range(layout.cells_count):
            value = table_row[_COMM_COLUMN + j]
            if value is None:
                continue
            if type(value) not in (int, float, str):
                return _REFERENCE
            slots.append((_COMM_COLUMN + j, "%s", layout.cells + j))
        slots.sort()
    line = row_template(table_row, [(column, spec) for column, spec, _ in slots])
    if line is None:
        return _REFERENCE
    spans_text = SlotText.of(",".join(templates), picks, ",")
    row_text = SlotText.of(line, [value_index for _, _, value_index in slots], "")
    if spans_text is None or row_text is None:
        return _REFERENCE
    sums = tuple(table_slots) if repeated else None
    try:  # the columns this shape's later runs are encoded from, for this one row
        flat = flat_columns(StepColumns.of([row]), anchor_ns, [format(built.step.trace_id, "032x")],
                             [format(built.step.span_id, "016x")],
                             [[format(phase.span_id, "016x")] for phase in built.phases], sums)
        if layout is not None:
            group_ids = [[format(span.span_id, "016x")] for span in built.collectives]
            encode = None if otlp is None else otlp.attribute_fields
            flat += layout.columns([parts_of(built)], group_ids, encode)
        integers = tuple(sorted({i for i in (*spans_text.picks, *row_text.picks) if type(flat[i][0]) is int}))
        protobuf = None if otlp is None else StepProtobuf.of(otlp, built, protobuf_picks, span_keys, flat,
                                                             LIST_KEYS)
        shape = _Shape(spans_text, row_text, integers, sums, protobuf, layout)
        texts = value_texts(flat, integers)
        same = shape.spans.fill(texts) == reference_json and shape.row.fill(texts) == reference_line
    except (TypeError, ValueError, OverflowError, IndexError):
        return _REFERENCE
    return shape if same else _REFERENCE
