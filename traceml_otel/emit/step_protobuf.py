"""OTLP protobuf of a templated step shape's spans, a column at a time (OTLP export's fast path).

With OTLP span export on, building span objects for each step (a ``SpanData`` and an attribute dict
per span) and encoding them one by one (:class:`~traceml_otel.emit.otlp_encode.SpanEncoder`) was
over half of the emitter's CPU per step. :mod:`traceml_otel.emit.step_lines` already has each step
*shape*'s values as columns for the local copy's JSON; :class:`StepProtobuf` is the same shape's
spans as protobuf pieces (:meth:`SpanEncoder.template`: constants, and slots for ids, times and the
attributes that vary), filled for a whole run by ``map`` and ``join`` over those columns. A step
becomes an :class:`EncodedStep`: its spans' bytes, its ids and span count, what export and the
metrics read, and no span objects.

Exactness. A shape's template is made from its first row's spans and kept only when, filled with
that row's values, it gives :meth:`SpanEncoder.encode`'s bytes for them exactly; otherwise the
shape's steps are built as span objects as before. ``tests/emit/test_step_protobuf.py`` compares
both on thousands of random rows.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add
from typing import Any

from traceml_otel.emit.otlp_encode import (
    DOUBLE_SLOT,
    ID_SLOT,
    RAW_SLOT,
    TIME_SLOT,
    TRACE_SLOT,
    SpanEncoder,
    varint,
)
from traceml_otel.emit.spans import SpanData, StepSpans
from traceml_otel.emit.step_run import StepRun

_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
_HEADS = [b"\x12" + varint(n) for n in range(1 << 12)]
"""``ScopeSpans.spans`` (2) tag and length of a span message under 4 KiB (ours are a few hundred)."""


@dataclass(slots=True)
class EncodedStep:
    """One step's spans as OTLP export sends them (no span objects): each span's ``ScopeSpans.spans``
    field, the step span first (empty without OTLP span export), with what the span budget and the
    metrics' exemplars read; a step with collectives has its collective spans too (the metrics read
    them)."""

    trace_id: int
    span_id: int
    count: int
    encoded: Sequence[bytes] = ()
    collectives: tuple[SpanData, ...] = ()
    pending: PendingFill | None = None
    """Under the span budget, the run its protobuf is filled from once the budget keeps it
    (:func:`fill_kept`); a step the budget drops is never filled."""
    index: int = 0
    """The step's row in ``pending``'s run, or in ``run``."""
    run: StepRun | None = None
    """Without the span budget, the run whose columns the metrics and the time account read instead
    of a record (:mod:`traceml_otel.emit.step_run`)."""

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True, slots=True)
class PendingFill:
    """A run's template and flat layout, kept until the span budget has decided its steps."""

    protobuf: StepProtobuf
    flat: list[Any]


def fill_kept(steps: Sequence[object], decisions: Sequence[object | None] | None) -> None:
    """Fill the protobuf of the steps whose fill waits for the span budget (``pending``): those kept
    (a decision that is not ``None``; every step when ``decisions`` is ``None``), a run at a time; the
    dropped ones only let go of their run."""
    runs: dict[int, tuple[PendingFill, list[EncodedStep]]] = {}
    for k, step in enumerate(steps):
        if type(step) is not EncodedStep or step.pending is None:
            continue
        if decisions is None or decisions[k] is not None:
            runs.setdefault(id(step.pending), (step.pending, []))[1].append(step)
        step.pending = None
    for pending, kept in runs.values():
        for step, encoded in zip(kept, pending.protobuf.fill(pending.flat, [step.index for step in kept]),
                                 strict=True):
            step.encoded = encoded


@dataclass(frozen=True, slots=True)
class _SpanPieces:
    constants: tuple[bytes, ...]
    """One more than ``slots``: before the first slot, between them, after the last."""
    slots: tuple[tuple[str, int], ...]
    """Each slot's kind (or an int attribute's key) and the flat layout's index it takes."""


class StepProtobuf:
    """One step shape's spans as protobuf pieces, filled a run at a time."""

    def __init__(self, encoder: SpanEncoder, spans: tuple[_SpanPieces, ...]) -> None:
        self._encoder = encoder
        self._spans = spans

    @classmethod
    def of(cls, encoder: SpanEncoder, built: StepSpans, picks: Sequence[Sequence[int]],
           variable: Sequence[Sequence[str]], flat: list[Any], raw: Sequence[str] = (),
           ) -> StepProtobuf | None:
        """The template of ``built``'s shape: each span's slots take ``picks`` (the JSON template's, in
        the same order: ids, times, then the attributes named in ``variable``) from the flat layout
        (:func:`~traceml_otel.emit.step_columns.flat_columns`); ``flat`` is ``built``'s own row's. An
        attribute named in ``raw`` takes a column of its whole encoded field. ``None`` unless the
        filled template gives :meth:`SpanEncoder.encode`'s bytes."""
        spans = built.all()
        if len(spans) != len(picks):
            return None
        made = []
        for span, span_picks, keys in zip(spans, picks, variable, strict=True):
            pieces = encoder.template(span, keys, raw)
            if pieces is None or len(pieces) != 2 * len(span_picks) + 1:
                return None
            made.append(_SpanPieces(tuple(pieces[::2]), tuple(zip(pieces[1::2], span_picks, strict=True))))  # type: ignore[arg-type]
        template = cls(encoder, tuple(made))
        try:
            same = list(template.fill(flat)[0]) == [encoder.encode(span) for span in spans]
        except (TypeError, ValueError, OverflowError, IndexError, struct.error):
            return None
        return template if same else None

    def fill(self, flat: list[Any], rows: Sequence[int] | None = None) -> list[tuple[bytes, ...]]:
        """Each step's spans' fields, from a run's flat layout (ids as hex text, floats as their
        ``repr`` text, as :func:`~traceml_otel.emit.step_columns.flat_columns` gives them); only the
        steps at ``rows`` of the run, in that order, when given."""
        values: dict[tuple[str, int], list[bytes]] = {}
        varints: dict[int, list[bytes]] = {}
        columns = []
        for span in self._spans:
            parts: list[Any] = []
            for constant, slot in zip(span.constants, span.slots):  # noqa: B905 (one more constant)
                column = values.get(slot)
                if column is None:
                    column = values[slot] = self._column(slot, flat, varints, rows)
                parts += [repeat(constant), column]
            parts.append(repeat(span.constants[-1]))
            bodies = list(map(b"".join, zip(*parts, strict=False)))  # the constants repeat
            lengths = list(map(len, bodies))
            if max(lengths) < len(_HEADS):
                heads = list(map(_HEADS.__getitem__, lengths))
            else:
                heads = [b"\x12" + varint(n) for n in lengths]
            columns.append(list(map(add, heads, bodies)))
        return list(zip(*columns, strict=True))

    def _column(self, slot: tuple[str, int], flat: list[Any], varints: dict[int, list[bytes]],
                rows: Sequence[int] | None = None) -> list[bytes]:
        """One slot's bytes for each step of the run (those at ``rows``, when given)."""
        kind, pick = slot
        column = flat[pick]
        if kind == DOUBLE_SLOT:
            seconds = getattr(column, "seconds", None)  # the floats the texts spell (step_columns)
            floats = seconds if seconds is not None else list(map(float, column))
            if rows is not None:
                floats = [floats[row] for row in rows]
            return list(map(_DOUBLE, floats))
        if rows is not None:
            column = [column[row] for row in rows]
        if kind == RAW_SLOT:  # a whole attribute field, encoded per step (emit/step_collectives.py)
            return column
        if kind == TRACE_SLOT or kind == ID_SLOT:
            return list(map(bytes.fromhex, column))
        if kind == TIME_SLOT:
            return list(map(_FIXED64, column))
        prefix = self._encoder.int_prefix
        if column.count(column[0]) == len(column):  # one value in the whole run (often: calls, peaks)
            one = varint(column[0])
            return [prefix(kind, len(one)) + one] * len(column)
        encoded = varints.get(pick)
        if encoded is None:
            encoded = varints[pick] = list(map(varint, column))
        lengths = list(map(len, encoded))
        prefixes = {length: prefix(kind, length) for length in set(lengths)}
        return list(map(add, map(prefixes.__getitem__, lengths), encoded))
