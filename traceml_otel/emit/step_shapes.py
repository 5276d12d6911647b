"""What decides a step row's templates: its shape key, and a batch cut into runs of one shape.

:mod:`traceml_otel.emit.step_lines` templates each step *shape*: which optional values a row has and
of which types, its parallelism, source and phase sequence, and (a DDP step) its collective calls'
types, kinds and sources (the rest of a DDP step's shape is in its values:
:func:`~traceml_otel.emit.step_collectives.signature`). A batch is usually one shape, which
:func:`one_shape` confirms a column at a time; otherwise each row's key is computed.
"""

from __future__ import annotations

from itertools import chain, groupby
from operator import itemgetter, not_
from typing import Any

from traceml_otel.emit.step_collectives import calls_key, same_calls
from traceml_otel.emit.step_columns import NUMBERS, ROW_PHASES, StepColumns
from traceml_otel.wire.step_row import ROW_FIELDS
from traceml_otel.wire.step_schema import KEY, PHASE_WIDTH, REFERENCE, SLOT, STEP_FIELDS

# Slots of a step row (wire/step_schema.py) the fast path reads or checks.
ROW_KEYS = tuple(f.slot for f in STEP_FIELDS if f.encoder == KEY)
"""Slots every row of a shape has the same value in (parallelism, source)."""
_ROW_ZERO_ABSENT = tuple(f.slot for f in NUMBERS if f.absent_when_zero)
"""Numbers whose attribute is left out when 0: whether each is 0 is part of the shape."""
_ROW_REFERENCE = tuple(f.slot for f in STEP_FIELDS if f.encoder == REFERENCE and f.name != "collectives")
"""Slots whose value, when set, sends a row to the reference path (an exception, a new DataLoader,
fetches inside the step, skipped updates: rare shapes; the decoder folds the in-step wait into the
step's input wait). Collectives, the schema's other ``REFERENCE`` slot, are part of the key instead
(:func:`~traceml_otel.emit.step_collectives.calls_key`)."""
_UNSET: tuple[object, ...] = (None, 0, (), [])
_ROW_BETWEEN = SLOT["between_ns"]
_COLLECTIVES = SLOT["collectives"]
PLAIN_KEY = range(6)
"""A key without collectives has six parts (one with collectives has two more)."""


def shape_key(row: Any) -> tuple[object, ...] | None:
    """What decides a row's templates; ``None`` for a row that always takes the reference path."""
    if type(row) is not list or len(row) != ROW_FIELDS:
        return None
    for slot in _ROW_REFERENCE:
        if row[slot] not in _UNSET:
            return None
    between = row[_ROW_BETWEEN]
    if between is not None and between < 0:
        return None
    phase_rows = row[ROW_PHASES]
    flat = tuple(chain.from_iterable(phase_rows))
    key = (tuple(map(type, row)), tuple([row[slot] for slot in ROW_KEYS]),
           tuple([not row[slot] for slot in _ROW_ZERO_ABSENT]),
           tuple(map(len, phase_rows)), flat[::PHASE_WIDTH], tuple(map(type, flat)))
    collectives = row[_COLLECTIVES]
    if collectives in _UNSET:
        return key
    if type(collectives) is not list:
        return None
    calls = calls_key(collectives)  # the rest of the shape is in each step's values (its signature)
    return None if calls is None else (*key, *calls)


def runs(rows: list[Any]) -> list[tuple[tuple[object, ...] | None, list[Any], StepColumns | None]]:
    """``rows`` as runs of consecutive rows of one shape key (``None``: rows that always take the
    reference path), with the run's columns when they were made on the way. A batch is usually one
    shape, which a check a column at a time confirms; otherwise each row's key is computed."""
    if not rows:
        return []
    key = row_key(rows[0])
    columns = None if key is None else one_shape(rows, key)
    if columns is not None:
        return [(key, rows, columns)]
    return [(key, list(run), None) for key, run in groupby(rows, row_key)]


def row_key(row: Any) -> tuple[object, ...] | None:
    try:
        return shape_key(row)
    except (TypeError, ValueError, IndexError):
        return None  # not a row the fast path reads: the decoder says what is wrong with it


def one_shape(rows: list[Any], key: tuple[object, ...]) -> StepColumns | None:
    """The run's columns when every row's :func:`shape_key` is ``key``, checked a column at a time
    (only for keys whose phase calls all have the full width: the others are never templated);
    ``None`` when some row's is not (or may not be)."""
    if len(key) != len(PLAIN_KEY) + 2 * (len(key) > len(PLAIN_KEY)):
        return None
    row_types, keys, zeros, phase_lengths, names, phase_types = key[:len(PLAIN_KEY)]
    if any(length != PHASE_WIDTH for length in phase_lengths):  # type: ignore[attr-defined]
        return None
    steps = len(rows)
    try:
        if (list(map(type, rows)) != [list] * steps or list(map(len, rows)) != [ROW_FIELDS] * steps
                or list(map(type, chain.from_iterable(rows))) != list(row_types) * steps):  # type: ignore[call-overload]
            return None
        step = list(zip(*rows, strict=True))
        for slot, value in zip(ROW_KEYS, keys, strict=True):  # type: ignore[call-overload]
            if step[slot].count(value) != steps:
                return None
        for slot, zero in zip(_ROW_ZERO_ABSENT, zeros, strict=True):  # type: ignore[call-overload]
            if list(map(not_, step[slot])) != [zero] * steps:
                return None
        if any(map(any, [step[slot] for slot in _ROW_REFERENCE])):  # (the types are the key's: all unset)
            return None
        if len(key) == len(PLAIN_KEY):
            if any(step[_COLLECTIVES]):
                return None
        elif not same_calls(step[_COLLECTIVES], key[-2], key[-1], steps):  # type: ignore[arg-type]
            return None
        if step[_ROW_BETWEEN][0] is not None and min(step[_ROW_BETWEEN]) < 0:
            return None
        calls = len(phase_lengths)  # type: ignore[arg-type]
        if list(map(len, step[ROW_PHASES])) != [calls] * steps:
            return None
        phase_rows = list(chain.from_iterable(step[ROW_PHASES]))  # step by step, call by call
        if (list(map(len, phase_rows)) != [PHASE_WIDTH] * len(phase_rows)
                or list(map(type, chain.from_iterable(phase_rows))) != list(phase_types) * steps  # type: ignore[call-overload]
                or list(map(itemgetter(0), phase_rows)) != list(names) * steps):  # type: ignore[call-overload]
            return None
    except (TypeError, ValueError):
        return None  # incomparable values: each row's own key says what it is
    return StepColumns(step, phase_rows, calls)


