"""A DDP step's communication values as columns, for the templated paths (``emit/step_lines.py``).

Every step of a DDP rank carries collective calls (its gradient buckets' ``all_reduce``), and those add
to its spans what its phases alone do not say: the step span's communication totals and wait entries,
the phases' exposed communication, one collective span per (source, kind). Those values depend on the
calls' times (which phase each started in, which completed last, the previous step's last exit), so
they are worked out per step here, by the span builder's own functions
(:func:`~traceml_otel.emit.spans.step_communication`, :func:`~traceml_otel.emit.spans.phase_communication`,
:func:`~traceml_otel.emit.spans.collective_groups`), and only what the builder would do with them after
(span objects, their JSON, CSV and protobuf one by one) is left to the templates. A step's
*signature* (:func:`signature`: which attributes each dict has, of which types, the groups' source and
kind) is part of its shape; the values become extra columns of the flat layout
(:class:`CollectiveLayout`), after the phase calls' slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, product, repeat
from operator import add
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.exposed_communication import step_exposures
from traceml_otel.emit.local_copy import attribute_json, span_template
from traceml_otel.emit.otlp_encode import varint
from traceml_otel.emit.spans import (
    RankInfo,
    SpanData,
    StepSpans,
    collective_groups,
    phase_communication,
    step_communication,
)
from traceml_otel.emit.step_columns import STEP_ID, TRACE, float_texts
from traceml_otel.emit.step_table import PHASE_SLOT
from traceml_otel.step_records import StepRecord

STEP_KEYS = frozenset({c.ATTR_COMM_CALLS, c.ATTR_COMM_BYTES, c.ATTR_COMM_CPU, c.ATTR_COMM_GPU,
                       c.ATTR_COMM_EXPOSED_CPU, c.ATTR_COMM_EXPOSED_GPU, c.ATTR_COMM_ENTRIES,
                       c.ATTR_COMM_WORK})
"""The step span's communication attributes (each a slot of a collective shape's templates)."""
LIST_KEYS = frozenset({c.ATTR_COMM_ENTRIES, c.ATTR_COMM_WORK})
"""Those whose value is a list: a slot holds the whole attribute (its JSON, its protobuf field)."""
PHASE_KEYS = frozenset({c.ATTR_PHASE_COMM_EXPOSED_CPU, c.ATTR_PHASE_COMM_EXPOSED_GPU})
GROUP_CONSTANT = frozenset({c.ATTR_RUN_ID, c.ATTR_RANK, c.ATTR_COLLECTIVE_SOURCE, c.ATTR_COLLECTIVE_KIND})
"""A collective span's attributes that a shape writes in (the signature holds source and kind)."""
CALL_TYPES = frozenset((str, str, int, end, int, bool, offset, duration)
                        for end, offset, duration in product(*[(int, type(None))] * 3))
"""A collective call's slot types the templates take (wire/step_row.py's ``CollectiveRow``)."""
_N = len(c.PHASES)
_COMM_CELLS = 6 + 2 * _N + 2
"""The step table's communication columns: six totals, per-phase exposed cpu and gpu, entries, work."""


@dataclass(slots=True)
class StepParts:
    """One step's communication values, as the span builder writes them."""

    record: StepRecord
    step: dict[str, object]
    """The step span's communication attributes."""
    phases: list[dict[str, object]]
    """Each phase call's exposed-communication attributes (empty: none started in it)."""
    groups: list[tuple[dict[str, object], int, int]]
    """Each collective span's attributes (from the step number on), start and end."""
    previous_exit_ns: int | None
    last_exit_ns: int | None


def step_parts(record: StepRecord, previous_exit_ns: int | None) -> StepParts | None:
    """``record``'s communication values (``None``: it has no collectives); ``previous_exit_ns``: when
    the rank left its last collective before this step (the builder's ``last_exit_ns``)."""
    exposures = step_exposures(record)
    if not exposures:
        return None
    step, last_exit_ns = step_communication(record, exposures, previous_exit_ns)
    return StepParts(record, step, [phase_communication(p, exposures) for p in record.phases],
                     collective_groups(exposures, record, record.gpu_duration_ns is not None),
                     previous_exit_ns, last_exit_ns)


def parts_of(built: StepSpans) -> StepParts:
    """The same values read back from a step's span objects (the reference path's first row)."""
    step = {k: v for k, v in built.step.attributes.items() if k in STEP_KEYS}
    phases = [{k: v for k, v in p.attributes.items() if k in PHASE_KEYS} for p in built.phases]
    groups = [({k: v for k, v in s.attributes.items() if k not in (c.ATTR_RUN_ID, c.ATTR_RANK)},
               s.start_ns, s.end_ns) for s in built.collectives]
    return StepParts(None, step, phases, groups, None, None)  # type: ignore[arg-type]


def signature(parts: StepParts) -> tuple[object, ...]:
    """What of a step's communication decides its templates: each dict's keys, and each collective
    span's source and kind. The values' types follow from the keys: the templated rows' calls have
    text kinds and sources and int times and bytes (:data:`CALL_TYPES`), and the step
    number, its times and the clock anchor are ints (the row's shape), so counts, bytes, times and
    steps are ints, durations floats (ns times 1e-9) and the entries and work lists."""
    return (tuple(parts.step), tuple(map(tuple, parts.phases)),
            tuple([(tuple(a), a[c.ATTR_COLLECTIVE_SOURCE], a[c.ATTR_COLLECTIVE_KIND])
                   for a, _, _ in parts.groups]))


def _ints(values: object) -> str | None:
    """A list attribute's step-table cell, as ``emit/step_table.py``'s ``step_row`` writes it."""
    if not isinstance(values, list | tuple):
        return None
    return " ".join(str(int(v)) for v in values[: c.MAX_COMM_ENTRIES])


_TOTALS = (c.ATTR_COMM_CALLS, c.ATTR_COMM_BYTES, c.ATTR_COMM_CPU, c.ATTR_COMM_GPU, c.ATTR_COMM_EXPOSED_CPU,
           c.ATTR_COMM_EXPOSED_GPU)
"""The step table's first six communication columns, each the step span's attribute."""


class CollectiveLayout:
    """Where a collective shape's values lie in the flat layout, from index ``first`` on: the step
    span's communication attributes (a list-valued one twice: its JSON, then its protobuf field),
    each phase call's, each collective span's start, end and attributes, the step table's
    communication cells, then each collective span's id."""

    def __init__(self, first: int, parts: StepParts, phase_names: Sequence[str]) -> None:
        index = first
        self.step: dict[str, int] = {}
        for key in parts.step:
            self.step[key] = index
            index += 2 if key in LIST_KEYS else 1
        self.phases: list[dict[str, int]] = []
        for values in parts.phases:
            self.phases.append({key: index + k for k, key in enumerate(values)})
            index += len(values)
        self.groups: list[tuple[int, int, dict[str, int]]] = []
        for attributes, _, _ in parts.groups:
            keys = [key for key in attributes if key not in GROUP_CONSTANT]
            self.groups.append((index, index + 1, {key: index + 2 + k for k, key in enumerate(keys)}))
            index += 2 + len(keys)
        self.cells = index
        self.cells_count = _COMM_CELLS
        index += _COMM_CELLS
        self.ids = list(range(index, index + len(parts.groups)))
        self._json: dict[str, tuple[str, str]] = {}
        self._fields: dict[tuple[str, int], bytes] = {}
        self._sums: list[list[int]] = [[] for _ in range(_N)]
        """Per phase of the table, the phase calls whose exposed communication its cells add, in order
        (``step_row``: a call with either attribute adds both, a missing one as 0.0)."""
        for i, (name, values) in enumerate(zip(phase_names, parts.phases, strict=True)):
            slot = PHASE_SLOT.get(name)
            if slot is not None and (c.ATTR_PHASE_COMM_EXPOSED_CPU in values
                                     or c.ATTR_PHASE_COMM_EXPOSED_GPU in values):
                self._sums[slot].append(i)

    def columns(self, steps: Sequence[StepParts], group_ids: list[list[str]],
                encode: Callable[[dict[str, object]], bytes] | None) -> list[Any]:
        """The run's columns in the layout's order, each made by one comprehension over the run's
        steps (a shape's steps have the same keys): floats as their ``repr`` text with the floats
        (:func:`~traceml_otel.emit.step_columns.float_texts`), ints, texts and bytes as they are;
        ``encode``: OTLP's attribute fields
        (:meth:`~traceml_otel.emit.otlp_encode.SpanEncoder.attribute_fields`), or ``None``."""
        columns: list[list[Any]] = []
        step = [parts.step for parts in steps]
        for key in self.step:
            column = [values[key] for values in step]
            if key in LIST_KEYS:
                single = _single_ints(column)
                columns.append(list(map(attribute_json, repeat(key), column)) if single is None
                               else self._list_json(key, single))
                columns.append([None] * len(column) if encode is None
                               else [encode({key: v}) for v in column] if single is None
                               else self._list_fields(encode, key, single))
            else:
                columns.append(column)
        for i, keys in enumerate(self.phases):
            phase = [parts.phases[i] for parts in steps]
            columns += [[values[key] for values in phase] for key in keys]
        for g, (_, _, keys) in enumerate(self.groups):
            groups = [parts.groups[g] for parts in steps]
            columns += [[group[1] for group in groups], [group[2] for group in groups]]
            columns += [[group[0][key] for group in groups] for key in keys]
        columns += [[values.get(key) for values in step] for key in _TOTALS]
        for key in (c.ATTR_PHASE_COMM_EXPOSED_CPU, c.ATTR_PHASE_COMM_EXPOSED_GPU):
            for calls in self._sums:
                sums = [0.0] * len(steps)
                for i in calls:  # added from 0.0 in call order, as step_row adds them
                    sums = list(map(add, sums, [parts.phases[i].get(key) or 0.0 for parts in steps]))
                columns.append(sums)
        for key in (c.ATTR_COMM_ENTRIES, c.ATTR_COMM_WORK):
            single = _single_ints([values.get(key) for values in step])
            columns.append([_ints(values.get(key)) for values in step] if single is None
                           else list(map(str, single)))
        return [float_texts(column) if type(column[0]) is float else column for column in columns] + group_ids


    def _list_json(self, key: str, values: list[int]) -> list[str]:
        """``attribute_json(key, [v])`` for each ``v``: the text around the one int is the same for a key."""
        made = self._json.get(key)
        if made is None:
            text = attribute_json(key, [_MARK])
            head, mark, tail = text.partition(str(_MARK))
            if not mark or tail.count(str(_MARK)):
                return [attribute_json(key, [v]) for v in values]
            made = self._json[key] = (head, tail)
        head, tail = made
        return [head + v + tail for v in map(str, values)]

    def _list_fields(self, encode: Callable[[dict[str, object]], bytes], key: str, values: list[int],
                     ) -> list[bytes]:
        """``encode({key: [v]})`` for each ``v``: the bytes before ``v``'s varint (the field ends with it)
        are the same for a key and a varint length, taken from the first value of that length."""
        fields = self._fields
        made = []
        for v in values:
            tail = varint(v)
            head = fields.get((key, len(tail)))
            if head is None:
                whole = encode({key: [v]})
                if not whole.endswith(tail):
                    return [encode({key: [one]}) for one in values]
                head = fields[key, len(tail)] = whole[:-len(tail)]
            made.append(head + tail)
        return made


_MARK = 987654321987654321


def _single_ints(column: list[Any]) -> list[int] | None:
    """The ints of a column of one-int lists (a steady DDP step's one wait entry), else ``None``."""
    if {type(v) for v in column} != {list} or list(map(len, column)) != [1] * len(column):
        return None
    ints = [v[0] for v in column]
    return ints if {type(v) for v in ints} == {int} else None


Kinds = tuple[tuple[type, ...], ...]
"""Each call's slot types."""
Named = tuple[tuple[str, str], ...]
"""Each call's kind and source."""


def calls_key(calls: Sequence[Any]) -> tuple[Kinds, Named] | None:
    """What a row's collective calls add to its shape key: their slot types, kinds and sources, in
    order (``None``: calls of another layout, which take the reference path)."""
    kinds = tuple([tuple(map(type, call)) for call in calls])
    if not CALL_TYPES.issuperset(kinds):  # only the capture side's own layout is templated
        return None
    return kinds, tuple([(call[0], call[1]) for call in calls])


def same_calls(calls: tuple[Any, ...], kinds: Kinds, named: Named, steps: int) -> bool:
    """Whether every row's calls (a run's column of them) have :func:`calls_key`'s types, kinds and
    sources, checked a column at a time."""
    if list(map(len, calls)) != [len(kinds)] * steps:
        return False
    flat = list(chain.from_iterable(calls))
    return ([tuple(map(type, call)) for call in flat] == list(kinds) * steps
            and [(call[0], call[1]) for call in flat] == list(named) * steps)


def collective_templates(built: StepSpans, layout: CollectiveLayout,
                         ) -> list[tuple[str, list[int], list[str]]] | None:
    """Each collective span's JSON template (:func:`~traceml_otel.emit.local_copy.span_template`), the
    flat layout's indices its slots take and its variable attributes' keys; ``None`` when one cannot
    be templated."""
    made = []
    for collective, (start, end, attributes), span_id in zip(built.collectives, layout.groups, layout.ids,
                                                             strict=True):
        template = span_template(collective, frozenset(attributes))
        if template is None or any(k not in attributes for k in template[1]):
            return None
        picks = [TRACE, span_id, STEP_ID, start, end, *(attributes[k] for k in template[1])]
        made.append((template[0], picks, template[1]))
    return made


def collective_spans(steps: Sequence[StepParts], rank: RankInfo, trace_ids: list[str], step_ids: list[str],
                     group_ids: list[list[str]]) -> list[tuple[SpanData, ...]]:
    """Each step's collective spans as the builder makes them (the metrics read them), with the ids
    its text and protobuf have."""
    common = {c.ATTR_RUN_ID: rank.run_id, c.ATTR_RANK: rank.rank}
    made = []
    for k, parts in enumerate(steps):
        trace_id, step_id = int(trace_ids[k], 16), int(step_ids[k], 16)
        made.append(tuple([
            SpanData(c.SPAN_COLLECTIVE, trace_id, int(ids[k], 16), step_id, start, end,
                     {**common, **attributes})
            for (attributes, start, end), ids in zip(parts.groups, group_ids, strict=True)]))
    return made
