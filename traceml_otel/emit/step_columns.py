"""A run of step rows of one shape as columns, and the text of each of their values.

:mod:`traceml_otel.emit.step_lines` encodes a batch's run of one shape a column at a time: the
values of every slot of the run's rows (:class:`StepColumns`), each value's text made by one ``map``
over its column (:func:`flat_columns`, in the flat layout the templates pick from), and the run's
text filled by one ``join`` (:class:`SlotText`). Per step that is C loops instead of a Python call and
a ``%`` scan of a 2.6 KB template.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add, mul, sub
from typing import Any

from traceml_otel import contract as c
from traceml_otel.wire.frames import orjson_module
from traceml_otel.wire.step_row import calls_in_order
from traceml_otel.wire.step_schema import NUMBER, SLOT, STEP_FIELDS, StepField

NS = 1e-9

# One step's values in a flat list: the step span's ids and times, its number and CPU duration, the
# schema's numbers (its NUMBER fields, in the schema's order), the table's per-phase sums, then seven
# slots per phase call.
TRACE, STEP_ID, START, END, STEP, CPU_DURATION = 0, 1, 2, 3, 4, 5
NUMBERS: tuple[StepField, ...] = tuple(f for f in STEP_FIELDS if f.encoder == NUMBER)
"""The step fields whose values the templates take, each at ``FIRST_NUMBER + i``."""
FIRST_NUMBER = 6
CPU_SUMS = FIRST_NUMBER + len(NUMBERS)
GPU_SUMS = CPU_SUMS + len(c.PHASES)
FIRST_PHASE = GPU_SUMS + len(c.PHASES)
ROW_PHASES = SLOT["phases"]
"""The phase calls' slot in a step row (wire/step_row.py's StepRow)."""
_NUMBER_COLUMNS = tuple((f.slot, f.scale != 1) for f in NUMBERS)
_STEP, _START, _END, _GPU = SLOT["step"], SLOT["start_ns"], SLOT["end_ns"], SLOT["gpu_duration_ns"]
NO_SUMS = (None,) * (2 * len(c.PHASES))


@dataclass(frozen=True, slots=True)
class SlotText:
    """A text with slots, filled for many steps by one ``join``: the text before the first slot, the
    constant text after each slot (after the last: joined to the next step's head by the separator),
    and the flat layout's index each slot takes."""

    head: str
    between: tuple[str, ...]
    tail: str
    picks: tuple[int, ...]

    @classmethod
    def of(cls, template: str, picks: list[int], separator: str) -> SlotText | None:
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


def value_texts(flat: list[Any], integers: tuple[int, ...]) -> list[Any]:
    """``flat`` with the integer columns the texts pick written as text (each column once, however
    many slots take it)."""
    texts = list(flat)
    fast = orjson_module()
    for i in integers:
        texts[i] = _integer_texts(flat[i], fast)
    return texts


def _integer_texts(column: list[int], fast: Any) -> list[str]:
    """Each integer's decimal text: ``orjson`` writes a column in one C call, ``repr`` each value
    (an int's ``repr`` is its ``str``, with less dispatch) where ``orjson`` is missing or refuses one
    (beyond 64 bits)."""
    if fast is not None and column:
        try:
            return fast.dumps(column)[1:-1].decode().split(",")
        except TypeError:  # orjson.JSONEncodeError: an integer wider than 64 bits
            pass
    return list(map(repr, column))


class StepColumns:
    """A run's rows as columns: each step slot's values, and each phase call's slots' values."""

    __slots__ = ("phases", "step")

    def __init__(self, step: list[tuple[Any, ...]], phase_rows: list[Any], calls: int) -> None:
        self.step = step
        self.phases: list[list[tuple[Any, ...]]] = [
            list(zip(*phase_rows[i::calls], strict=True)) for i in range(calls)]

    @classmethod
    def of(cls, rows: list[Any]) -> StepColumns:
        """Rows of one shape (each row's key computed): the same number of phase calls each."""
        step = list(zip(*rows, strict=True))
        calls = len(step[ROW_PHASES][0])
        return cls(step, list(chain.from_iterable(step[ROW_PHASES])), calls)


class SecondsTexts(list[str]):
    """A column of durations' texts (:func:`seconds_text`), with the floats they spell (``seconds``):
    OTLP protobuf (:mod:`traceml_otel.emit.step_protobuf`) packs those, not the text read back."""

    __slots__ = ("seconds",)
    seconds: list[float]


def seconds_text(nanoseconds: Iterable[int]) -> list[str]:
    """Each duration in seconds as its ``repr`` text (the shortest round trip, as JSON writes it).

    ``repr`` of a float is costly (CPython's exact ``dtoa``, about 4,000 instructions). Where every
    value lies where ``repr`` writes plain decimals (1e-4 <= |x| < 1e16), ``orjson`` writes the same
    digits (also the shortest round trip) in one C call for the whole column; below 1e-4 ``repr``
    writes an exponent (``5.6e-05``) that ``orjson`` spells otherwise (``0.000056``), so such a column
    takes ``repr`` (rewriting orjson's text in Python cost more than ``repr``).
    ``tests/emit/test_step_lines.py`` compares the result with ``repr`` on a third of a million values."""
    values = list(map(mul, nanoseconds, repeat(NS)))
    fast = orjson_module()
    texts = None
    if fast is not None and values and min(map(abs, values)) >= 1e-4 and max(map(abs, values)) < 1e16:
        texts = fast.dumps(values)[1:-1].decode().split(",")
        if texts[0] != repr(values[0]):  # one value checked per column, in case orjson ever differs
            texts = None
    column = SecondsTexts(texts if texts is not None else map(repr, values))
    column.seconds = values
    return column


def float_texts(values: list[float]) -> SecondsTexts:
    """Each float as its ``repr`` text, with the floats (``seconds``): :func:`seconds_text`'s way for
    floats already made (the communication sums of ``emit/step_collectives.py``), where zeros (often:
    a bucket's exposed share, a phase without communication) do not send the column to ``repr``:
    ``orjson`` writes ``0.0`` and ``-0.0`` as ``repr`` does. A column with a NaN or an infinity (which
    ``orjson`` writes as ``null``) takes ``repr``."""
    fast = orjson_module()
    texts = None
    if fast is not None and values:
        magnitudes = [value for value in map(abs, values) if value]
        if not magnitudes or (min(magnitudes) >= 1e-4 and max(magnitudes) < 1e16):
            dumped = fast.dumps(values)
            if b"n" not in dumped:  # null: a NaN or an infinity
                texts = dumped[1:-1].decode().split(",")
                if texts[0] != repr(values[0]):
                    texts = None
    column = SecondsTexts(texts if texts is not None else map(repr, values))
    column.seconds = values
    return column


_SIXTEEN_DIGITS = re.compile(".{16}", re.DOTALL)
_ZERO_SPAN_HEX, _ONE_SPAN_HEX = "0" * 16, "0" * 15 + "1"


def span_id_texts(random_bits: Callable[[int], int], count: int) -> list[str]:
    """``count`` span ids as 16 hex digits each: the ids ``count`` calls of ``random_bits(64) or 1``
    would draw, in that order, drawn by one call. ``random.getrandbits(64 * n)`` fills its result from
    the lowest 32 bits up, as ``n`` calls of ``getrandbits(64)`` would draw them, so the first id is
    the lowest 64 bits: the last 16 digits of the whole number's hex text."""
    if count <= 0:
        return []
    texts = _SIXTEEN_DIGITS.findall(format(random_bits(64 * count), f"0{16 * count}x"))
    texts.reverse()
    if _ZERO_SPAN_HEX in texts:  # one in 2**64 per id: 0 is not a valid span id, the builder's is 1
        texts = [_ONE_SPAN_HEX if text == _ZERO_SPAN_HEX else text for text in texts]
    return texts


def flat_columns(columns: StepColumns, anchor_ns: int, trace_ids: list[str], step_ids: list[str],
                  phase_ids: list[list[str]], table_slots: tuple[int | None, ...] | None) -> list[Any]:
    """A run's values, one column per slot of the flat layout the templates pick from: what the
    decoder and the builder compute for each row, with the ids given as hex text (32 digits for trace
    ids, 16 for span ids) and each float as its ``repr`` text. A run has one shape, so a slot is
    ``None`` in every row or in none (a ``None`` column is never picked: its attribute or cell is
    absent)."""
    step = columns.step
    start, end, gpu = step[_START], step[_END], step[_GPU]
    starts = list(map(add, start, repeat(anchor_ns)))
    ends = list(map(add, end, repeat(anchor_ns)))
    on_gpu = gpu[0] is not None
    flat: list[Any] = [
        trace_ids, step_ids, starts, ends, step[_STEP], seconds_text(map(sub, end, start)),
        *[_optional_seconds(step[slot]) if seconds else step[slot] for slot, seconds in _NUMBER_COLUMNS],
        *NO_SUMS,
    ]
    phase_ends = []
    # The training thread leaves each call's number to us; a run's rows share their phase names, so
    # its numbers are the names' order, worked out once per run (a row that has them keeps them).
    numbers = calls_in_order([column[0][0] for column in columns.phases])
    for (_, call, phase_start, phase_end, offset, phase_gpu, nbytes), ids, number in zip(
            columns.phases, phase_ids, numbers, strict=True):
        if call[0] is None:
            call = (number,) * len(call)
        cpu_text = seconds_text(map(sub, phase_end, phase_start))
        if on_gpu and phase_gpu[0] is not None and offset[0] is not None:  # on the device's timeline
            phase_starts = list(map(add, starts, offset))
            phase_ends.append(list(map(add, phase_starts, phase_gpu)))
        else:
            phase_starts = list(map(add, phase_start, repeat(anchor_ns)))
            phase_ends.append(list(map(add, phase_end, repeat(anchor_ns))))
        flat += (ids, phase_starts, phase_ends[-1], call, cpu_text,
                 _optional_seconds(phase_gpu), nbytes)
    if on_gpu:
        flat[END] = list(map(max, ends, map(add, starts, gpu), *phase_ends))
    if table_slots is not None:
        flat[CPU_SUMS:CPU_SUMS + len(NO_SUMS)] = _phase_sums(columns, table_slots)
    return flat


def _optional_seconds(nanoseconds: tuple[int | None, ...]) -> list[str] | None:
    return None if nanoseconds[0] is None else seconds_text(nanoseconds)



def _phase_sums(columns: StepColumns, table_slots: tuple[int | None, ...]) -> list[list[str]]:
    """The table's per-phase sums (cpu, then gpu) of steps that call a phase more than once, added
    from 0.0 in call order as the table's reference adds them, as ``repr`` text."""
    steps = len(columns.step[0])
    sums: list[Iterable[float]] = [[0.0] * steps for _ in NO_SUMS]
    for (_, _, phase_start, phase_end, _, phase_gpu, _), slot in zip(columns.phases, table_slots,
                                                                      strict=True):
        if slot is not None:
            sums[slot] = list(map(add, sums[slot], map(mul, map(sub, phase_end, phase_start), repeat(NS))))
            if phase_gpu[0] is not None:
                gpu_slot = len(c.PHASES) + slot
                sums[gpu_slot] = list(map(add, sums[gpu_slot], map(mul, phase_gpu, repeat(NS))))
    return [list(map(repr, column)) for column in sums]
