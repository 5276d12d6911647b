"""The step row: one completed step as the training thread hands it to the emitter.

A :class:`StepRow` is a ``list`` with named slots: every read and every later write goes by name
(the recorder fills in the device timings by name once CUDA events have completed), and on the
wire it is the same compact JSON list it always was, so encoding it costs what a plain list costs.
The recorder builds a plain list in this layout, positionally, once per step (a keyword call costs
more than the rest of the step's bookkeeping, see :meth:`StepRow.of`, and a ``StepRow`` 0.4 us more
than the list), and views it as a ``StepRow`` when it fills in device timings. Its phases and
collectives are :class:`PhaseRow` and :class:`CollectiveRow`, lists with named slots too. Times
are ``perf_counter_ns`` readings of the training process; :func:`decode_step` moves them onto the
epoch clock and returns a :class:`~traceml_otel.step_records.StepRecord` on the emitter side.

The slots are declared once, in :mod:`traceml_otel.wire.step_schema`; the named views, the row's
length, :data:`APPENDED_DEFAULTS`, :meth:`StepRow.of` and :func:`decode_step` are made from it at
import time. Fields are only ever appended, with a default (the schema's, and
``records.StepRecord``'s): a row from an older capture side (shorter) still decodes, and slots a
newer one appended (longer) are ignored. The layout is version 2 of the stream
(:data:`traceml_otel.wire.frames.WIRE_VERSION`), unchanged from version 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from operator import itemgetter
from typing import Any

from traceml_otel.step_records import CollectiveTiming, LoaderSettings, PhaseTiming, StepRecord
from traceml_otel.wire.frames import WireError
from traceml_otel.wire.step_schema import (
    FIRST_LAYOUT_FIELDS,
    PHASE_FIELDS,
    PHASE_WIDTH,
    ROW_FIELDS,
    SLOT,
    STEP_FIELDS,
    WIRE_ORDER,
    StepField,
    appended_defaults,
)


def _slot(index: int, doc: str) -> Any:
    """A named read-write view of ``row[index]`` (reads run in C, through ``itemgetter``)."""

    def set_slot(row: list[Any], value: Any) -> None:
        row[index] = value

    return property(itemgetter(index), set_slot, doc=doc)


class PhaseRow(list):
    """One call of one phase: ``[phase, call, start_ns, end_ns, gpu_offset_ns, gpu_duration_ns, nbytes]``,
    and for a forward of a step that ran more than one model, ``module`` appended (an eighth slot: the
    model's class name; rows without it keep seven slots, and such rows take the emitter's reference
    path)."""

    __slots__ = ()

    @classmethod
    def timed(cls, phase: str, call: int | None, start_ns: int, end_ns: int, nbytes: int | None) -> PhaseRow:
        """A phase call the CPU clock timed (its device timings come later, on CUDA).

        The recorder appends a plain list in this layout instead, once per phase call on the training
        thread (a list subclass costs about 0.3 us more to build and release), and views it as a
        ``PhaseRow`` when it fills in the device timings; both encode to the same JSON list.
        """
        return cls((phase, call, start_ns, end_ns, None, None, nbytes))


class CollectiveRow(list):
    """One collective call: ``[kind, source, start_ns, end_ns, nbytes, blocking, gpu_offset_ns,
    gpu_duration_ns]``. ``end_ns`` is set when the call completes, possibly on another thread."""

    __slots__ = ()
    kind = _slot(0, "``all_reduce``, ``broadcast``, ...")
    source = _slot(1, "Who called it: ``ddp`` (a gradient bucket) or ``api`` (``torch.distributed``).")
    start_ns = _slot(2, "CPU clock reading at the call.")
    end_ns = _slot(3, "CPU clock reading at completion; None while it has not completed.")
    nbytes = _slot(4, "Bytes in the tensors it reduces or moves.")
    blocking = _slot(5, "True when the caller waited for the whole call.")
    gpu_offset_ns = _slot(6, "CUDA events: from the step's start event to the call.")
    gpu_duration_ns = _slot(7, "CUDA events: the call's duration on the device.")

    @classmethod
    def started(cls, *, kind: str, source: str, start_ns: int, nbytes: int, blocking: bool) -> CollectiveRow:
        """A collective that has just been called."""
        return cls((kind, source, start_ns, None, nbytes, blocking, None, None))


class StepRow(list):
    """One completed step, as a list with named slots (see the module docstring for the rules)."""

    __slots__ = ()

    @classmethod
    def of(cls, **values: Any) -> StepRow:
        """A row built by name (the slots' names, :data:`~traceml_otel.wire.step_schema.STEP_FIELDS`);
        slots not given are "not measured" (their default: None, 0, empty).

        Not for the training thread: a keyword call with this many arguments costs about 1 us in
        CPython 3.11, as much as the rest of ``end_step``. The recorder builds its rows
        positionally (a plain list, slots in wire order), views them as ``StepRow`` to set the
        device timings by name; ``tests/wire/test_step_row.py`` checks it puts each value in its slot.
        """
        unknown = values.keys() - SLOT.keys()
        if unknown:
            raise TypeError(f"StepRow.of() got unknown slots {sorted(unknown)}")
        return cls([values[f.name] if f.name in values else _not_measured(f.default) for f in WIRE_ORDER])

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> StepRow:
        """A row as read from a frame: a shorter row gets the appended fields' defaults, a longer
        one loses the slots this side does not know."""
        if not isinstance(values, list) or len(values) < FIRST_LAYOUT_FIELDS:
            raise WireError(f"a step row needs at least {FIRST_LAYOUT_FIELDS} fields")
        known = values[:ROW_FIELDS]
        return cls((*known, *APPENDED_DEFAULTS[len(known) - FIRST_LAYOUT_FIELDS:]))


APPENDED_DEFAULTS: tuple[Any, ...] = appended_defaults()
"""Values of the appended slots (every slot from :data:`FIRST_LAYOUT_FIELDS` on) a shorter row lacks."""

for _field in STEP_FIELDS:
    setattr(StepRow, _field.name, _slot(_field.slot, _field.doc))
for _index, _phase_field in enumerate(PHASE_FIELDS):
    setattr(PhaseRow, _phase_field.name, _slot(_index, _phase_field.doc))


def _not_measured(default: Any) -> Any:
    """A slot's "not measured" value (a fresh list for an empty sequence)."""
    return list(default) if isinstance(default, tuple) else default


_DECODER = """
def decode_step(values, anchor_ns):
    if type(values) is not list or len(values) != ROW_FIELDS:
        values = StepRow.from_wire(values)
    ({slots},) = values
    if isinstance(input_wait_in_step_ns, int) and input_wait_in_step_ns > 0:  # the input wait holds it too
        input_wait_ns = (input_wait_ns or 0) + input_wait_in_step_ns
    else:
        input_wait_in_step_ns = None
    if phases and None in [row[1] if len(row) > 1 else 0 for row in phases]:
        _number_unnumbered(phases)  # as the training thread sends them: calls in order, unnumbered
    phases = tuple([
        PhaseTiming(phase, call, start + anchor_ns, end + anchor_ns, gpu_offset, gpu_duration, nbytes,
                    module if type(module) is str else None)
        for phase, call, start, end, gpu_offset, gpu_duration, nbytes, module in map(_phase_slots, phases)
    ])
    collectives = tuple([
        CollectiveTiming(
            kind=k.kind, source=k.source, start_ns=k.start_ns + anchor_ns,
            end_ns=None if k.end_ns is None else k.end_ns + anchor_ns, nbytes=k.nbytes,
            blocking=bool(k.blocking), gpu_offset_ns=k.gpu_offset_ns, gpu_duration_ns=k.gpu_duration_ns,
        )
        for k in map(CollectiveRow, collectives)
    ]) if collectives else ()
    return StepRecord({arguments})
"""
"""The decoder's source, filled from the schema at import time: the slots unpacked in one statement
(reading them one by one through the named views cost the emitter about 10 us per step) and the
record built positionally, in its field order (a keyword call costs 1-2 us more per step)."""

_DECODED = {
    "start_ns": "start_ns + anchor_ns",
    "end_ns": "end_ns + anchor_ns",
    "loader": "LoaderSettings(*loader[:6]) if loader else None",
    "source": "source if isinstance(source, str) else None",
    "between_ns": "between_ns if isinstance(between_ns, int) and between_ns >= 0 else None",
    "skipped_updates": "skipped_updates if isinstance(skipped_updates, int) and skipped_updates > 0 else 0",
}
"""Slots the record does not take as they are (the others are passed through)."""


def decoder_source(fields: tuple[StepField, ...], record_fields: Sequence[str]) -> str:
    """:func:`decode_step`'s source for a schema and a record's field names (in the record's order).

    Raises ``ValueError`` when a record field has no slot or a slot no record field."""
    by_record = {f.record_field: f for f in fields}
    missing = [name for name in record_fields if name not in by_record]
    unused = sorted(set(by_record) - set(record_fields))
    if missing or unused:
        raise ValueError(f"record fields without a slot {missing}, slots without a record field {unused}")
    arguments = [_DECODED.get(by_record[name].name, by_record[name].name) for name in record_fields]
    slots = [f.name for f in sorted(fields, key=lambda f: f.slot)]
    return _DECODER.format(slots=", ".join(slots), arguments=", ".join(arguments))


def _make_decoder() -> Any:
    namespace: dict[str, Any] = {
        "StepRow": StepRow, "ROW_FIELDS": ROW_FIELDS, "PhaseTiming": PhaseTiming,
        "CollectiveTiming": CollectiveTiming, "CollectiveRow": CollectiveRow, "StepRecord": StepRecord,
        "LoaderSettings": LoaderSettings, "_number_unnumbered": _number_unnumbered,
        "_phase_slots": _phase_slots,
    }
    exec(decoder_source(STEP_FIELDS, [f.name for f in fields(StepRecord)]), namespace)
    decode = namespace["decode_step"]
    decode.__doc__ = """Turn a step row read from a frame into a record, moving CPU readings onto the
    epoch clock.

    ``anchor_ns`` is the trainer's ``time_ns() - perf_counter_ns()`` (from its hello). Its source is
    made from the schema at import time (:func:`decoder_source`); ``tests/wire/test_step_row.py``
    checks each slot lands in its field."""
    decode.__module__ = __name__
    return decode


_PHASE_FIELDS = PHASE_WIDTH + 1
"""Slots of a phase row with its model's class (the usual row has the first :data:`PHASE_WIDTH`)."""


def calls_in_order(names: Sequence[Any]) -> tuple[int, ...]:
    """Each phase call's number (which call of its phase in the step, from 0) from the step's phase
    names in the order the calls ended: ``forward, backward, forward`` -> ``0, 0, 1``.

    The training thread leaves ``call`` as ``None`` (counting there cost every phase call a
    dictionary read and write); the order is all the count needs, so the emitter numbers them: once
    per run of rows of one shape on the default path (``emit/step_columns.py``), per row in
    :func:`decode_step`."""
    seen: dict[Any, int] = {}
    calls = []
    for name in names:
        call = seen.get(name, 0)
        calls.append(call)
        seen[name] = call + 1
    return tuple(calls)


def _number_unnumbered(phase_rows: list[Any]) -> None:
    """:func:`calls_in_order`, written into a row's unnumbered phase calls (a number already there
    stays and counts; a name that is not a string counts as ``None``'s)."""
    names = [phase[0] if len(phase) and isinstance(phase[0], str) else None for phase in phase_rows]
    for phase, call in zip(phase_rows, calls_in_order(names), strict=True):
        if isinstance(phase, list) and len(phase) > 1 and phase[1] is None:
            phase[1] = call


def _phase_slots(row: Sequence[Any]) -> Sequence[Any]:
    """A phase row's eight slots: a row of seven gets no model class, a longer row from a newer
    trainer loses the slots we do not know."""
    length = len(row)
    if length == PHASE_WIDTH:
        return (*row, None)
    return row if length == _PHASE_FIELDS else row[:_PHASE_FIELDS]


decode_step: Callable[[Sequence[Any], int], StepRecord] = _make_decoder()
