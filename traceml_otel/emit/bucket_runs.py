"""A DDP rank's steady steps' communication values, a column at a time over a run of one shape.

The common DDP step hands its gradient buckets over inside one backward call: every call of the step
is a ``ddp`` bucket of one kind, placed in the same phase call, each one's end known. For a run of such
steps (one shape key: :mod:`traceml_otel.emit.step_shapes`) the span builder's per-step functions
(:func:`~traceml_otel.emit.step_collectives.step_parts`) reduce to a few sums and maxima per step:

- the buckets' exposed time (``exposed_communication.overlapped_tail``) adds up to
  ``max(last completion, last hand-over) - last hand-over``, on each clock;
- one wait entry, at the last hand-over, exiting at the last completion; the work before it counts
  from the previous step's exit (a running maximum over the run);
- one collective span for (``ddp``, kind), from the first hand-over to the last completion (on the
  device clock when the step's and the calls' device times are known);
- the phase call holding the buckets gets the exposed totals, the others nothing.

:func:`bucket_segments` cuts a run into segments of steps whose buckets lie in the same phase call,
and :func:`bucket_parts` works a segment's values out from its decoded records, giving the same
:class:`~traceml_otel.emit.step_collectives.StepParts` as ``step_parts`` step by step; anything else (API
calls, several kinds, buckets across phase calls or outside them, an unknown end, device times known
for some calls only) takes the per-step path. ``tests/emit/test_step_collectives.py``
holds both to the reference path's bytes on random rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, groupby
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.step_collectives import StepParts
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.step_schema import SLOT

_NS = 1e-9
_WITH_COMMUNICATION = ("forward", "backward", "optimizer")  # exposed_communication's phases
_CALL_TYPES_CPU = (str, str, int, int, int, bool, type(None), type(None))
_CALL_TYPES_GPU = (str, str, int, int, int, bool, int, int)


def bucket_key(key: tuple[object, ...]) -> str | None:
    """The kind of a shape key's calls when every call is a ``ddp`` bucket of that kind with its end
    known and its device times all known or all unknown (``None``: the per-step path's)."""
    kinds, named = key[-2], key[-1]
    if not named or not isinstance(named, tuple) or not isinstance(kinds, tuple):
        return None
    kind = named[0][0]
    if any(one != (kind, "ddp") for one in named):
        return None
    first = kinds[0]
    if first not in (_CALL_TYPES_CPU, _CALL_TYPES_GPU) or any(one != first for one in kinds):
        return None
    return kind


@dataclass(slots=True)
class BucketSteps:
    """What :func:`bucket_parts` reads of a run's steps, a list per value (times on the spans' clock)."""

    records: list[Any]
    """Each step's record, or ``None`` each when the run is not decoded (the local outputs only)."""
    steps: list[int]
    start_ns: list[int]
    input_wait_ns: list[int | None]
    on_gpu: list[bool]
    """Whether the step's device time is known (its collective span then takes the device clock)."""
    calls: list[list[tuple[Any, ...]]]
    """Each call's ``(kind, source, start, end, bytes, device offset, device duration)``."""
    phases: list[list[tuple[Any, Any, Any]]]
    """Each phase call's ``(name, start, end)``."""

    @classmethod
    def of_records(cls, records: list[StepRecord]) -> BucketSteps:
        return cls(records, [r.step for r in records], [r.start_ns for r in records],
                   [r.input_wait_ns for r in records], [r.gpu_duration_ns is not None for r in records],
                   [[(k.kind, k.source, k.start_ns, k.end_ns, k.nbytes, k.gpu_offset_ns, k.gpu_duration_ns)
                     for k in r.collectives] for r in records],
                   [[(p.phase, p.start_ns, p.end_ns) for p in r.phases] for r in records])

    @classmethod
    def of_rows(cls, rows: list[Any], anchor_ns: int) -> BucketSteps:
        """The same values straight from the rows, as ``decode_step`` would place them (the shape key
        says their types: no row here is one the decoder changes otherwise)."""
        a = anchor_ns
        return cls([None] * len(rows), [row[_STEP] for row in rows], [row[_START] + a for row in rows],
                   [row[_INPUT_WAIT] for row in rows], [row[_GPU] is not None for row in rows],
                   [[(k[0], k[1], k[2] + a, None if k[3] is None else k[3] + a, k[4], k[6], k[7])
                     for k in row[_COLLECTIVES]] for row in rows],
                   [[(p[0], p[2] + a, p[3] + a) for p in row[_PHASES]] for row in rows])

    def cut(self, first: int, stop: int) -> BucketSteps:
        return BucketSteps(*(getattr(self, name)[first:stop] for name in _FIELDS))


_FIELDS = ("records", "steps", "start_ns", "input_wait_ns", "on_gpu", "calls", "phases")
_STEP, _START, _GPU = SLOT["step"], SLOT["start_ns"], SLOT["gpu_duration_ns"]
_INPUT_WAIT, _PHASES, _COLLECTIVES = SLOT["input_wait_ns"], SLOT["phases"], SLOT["collectives"]


def bucket_parts(run: BucketSteps, kind: str, index: int, previous_exit_ns: int | None,
                 ) -> list[StepParts] | None:
    """Each step's communication values when every step's buckets lie in its phase call ``index``
    (:func:`bucket_segments` found it), for :func:`bucket_key`'s case; ``None``: not that case."""
    calls = run.calls
    if {k[:2] for step in calls for k in step} != {(kind, "ddp")}:
        return None
    starts: list[list[int]] = [[k[2] for k in step] for step in calls]
    ends: list[list[Any]] = [[k[3] for k in step] for step in calls]
    if None in chain.from_iterable(ends):
        return None
    first_start = list(map(min, starts))
    last_start = list(map(max, starts))
    last_end = list(map(max, ends))
    offsets: list[list[Any]] = [[k[5] for k in step] for step in calls]
    durations: list[list[Any]] = [[k[6] for k in step] for step in calls]
    flat_offsets = list(chain.from_iterable(offsets)) + list(chain.from_iterable(durations))
    device = flat_offsets.count(None) == 0
    if not device and flat_offsets.count(None) != len(flat_offsets):
        return None
    count = len(calls[0])
    nbytes = [sum([k[4] for k in step]) for step in calls]
    cpu = [(sum(e) - sum(s)) * _NS for s, e in zip(starts, ends, strict=True)]
    exposed = [(max(e, s) - s) * _NS for s, e in zip(last_start, last_end, strict=True)]
    previous = previous_exit_ns
    if previous is None:
        previous = run.start_ns[0] - (run.input_wait_ns[0] or 0)
    exits = list(accumulate(last_end, max, initial=previous))  # each step's previous exit, then its own
    work = [max(0, s - p) for s, p in zip(last_start, exits, strict=False)]
    group_start: list[Any] = first_start
    group_end: list[Any] = last_end
    gpu: list[Any] = []
    exposed_gpu: list[Any] = []
    if device:
        gpu_ends = [[o + d for o, d in zip(os, ds, strict=True)]
                    for os, ds in zip(offsets, durations, strict=True)]
        gpu = [sum(d) * _NS for d in durations]
        last_offset = list(map(max, offsets))
        exposed_gpu = [(max(e, s) - s) * _NS for s, e in zip(last_offset, map(max, gpu_ends), strict=True)]
        if any(run.on_gpu):
            group_start = [t + min(o) if g else s
                           for t, o, g, s in zip(run.start_ns, offsets, run.on_gpu, first_start, strict=True)]
            group_end = [t + max(e) if g else s
                         for t, e, g, s in zip(run.start_ns, gpu_ends, run.on_gpu, last_end, strict=True)]
    phases = len(run.phases[0])
    parts = []
    for k, record in enumerate(run.records):
        step: dict[str, object] = {
            c.ATTR_COMM_CALLS: count, c.ATTR_COMM_BYTES: nbytes[k], c.ATTR_COMM_CPU: cpu[k]}
        group: dict[str, object] = {
            c.ATTR_STEP: run.steps[k], c.ATTR_COLLECTIVE_SOURCE: "ddp", c.ATTR_COLLECTIVE_KIND: kind,
            c.ATTR_COLLECTIVE_CALLS: count, c.ATTR_COLLECTIVE_BYTES: nbytes[k], c.ATTR_COLLECTIVE_CPU: cpu[k]}
        phase: dict[str, object]
        if device:
            step[c.ATTR_COMM_GPU] = group[c.ATTR_COLLECTIVE_GPU] = gpu[k]
            step[c.ATTR_COMM_EXPOSED_CPU] = group[c.ATTR_COLLECTIVE_EXPOSED_CPU] = exposed[k]
            step[c.ATTR_COMM_EXPOSED_GPU] = group[c.ATTR_COLLECTIVE_EXPOSED_GPU] = exposed_gpu[k]
            phase = {c.ATTR_PHASE_COMM_EXPOSED_CPU: exposed[k], c.ATTR_PHASE_COMM_EXPOSED_GPU: exposed_gpu[k]}
        else:
            step[c.ATTR_COMM_EXPOSED_CPU] = group[c.ATTR_COLLECTIVE_EXPOSED_CPU] = exposed[k]
            phase = {c.ATTR_PHASE_COMM_EXPOSED_CPU: exposed[k]}
        step[c.ATTR_COMM_ENTRIES] = [last_start[k]]
        step[c.ATTR_COMM_WORK] = [work[k]]
        values: list[dict[str, object]] = [{} for _ in range(phases)]
        values[index] = phase
        start = group_start[k]
        parts.append(StepParts(record, step, values, [(group, start, max(start, group_end[k]))],
                               exits[k] if k else previous_exit_ns, exits[k + 1]))
    return parts


def placements(run: BucketSteps) -> list[int | None]:
    """Per step, the phase call (its index) whose interval holds every call's start with no earlier
    forward, backward or optimizer call holding any (``exposed_communication`` places a call in the
    first such call that holds it); ``None``: the calls are not all in one call, or it cannot tell."""
    names = [p[0] for p in run.phases[0]]
    guess: int | None = None
    made: list[int | None] = []
    for calls, phases in zip(run.calls, run.phases, strict=True):
        starts = [k[2] for k in calls]
        low, high = min(starts), max(starts)
        if guess is None or not _holds(phases, names, guess, low, high):
            guess = next((i for i, p in enumerate(phases) if p[0] in _WITH_COMMUNICATION
                          and p[1] <= low < p[2]), None)
            if guess is not None and not _holds(phases, names, guess, low, high):
                guess = None
        made.append(guess)
    return made


def _holds(phases: Sequence[Any], names: list[str], index: int, low: int, high: int) -> bool:
    """Whether call ``index`` (named as the run's first step's) holds ``low..high`` and every earlier
    call that takes communication lies wholly before ``low`` or after ``high``."""
    if len(phases) != len(names) or index >= len(phases):
        return False
    name, start, end = phases[index]
    if name != names[index] or not start <= low <= high < end:
        return False
    return all(other[2] <= low or other[1] > high
               for other in phases[:index] if other[0] in _WITH_COMMUNICATION)


_ROW_ERRORS = (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError)
Segment = tuple[list[Any], list[StepRecord] | None, list[StepParts] | None]
"""Consecutive rows, their records (``None``: not decoded) and parts (``None``: the per-step path's)."""


def bucket_segments(key: tuple[object, ...], rows: list[Any], anchor_ns: int,
                    decode: Callable[..., StepRecord] | None, previous_exit: Callable[[], int | None],
                    ) -> Iterator[Segment]:
    """A run of one shape key cut into segments of consecutive steps whose buckets lie in the same
    phase call (:func:`bucket_parts` worked out) and the steps between (parts ``None``). Lazily: each
    segment's parts count the work before its first entry from ``previous_exit()`` as it is when the
    caller asks for that segment (after the steps before it were encoded). ``decode``: the wire's
    ``decode_step`` when the records are needed (span objects or OTLP), else ``None``: the values are
    read from the rows and the parts carry no record."""
    kind = bucket_key(key)
    records = run = None
    if kind is not None:
        try:
            if decode is None:
                run = BucketSteps.of_rows(rows, anchor_ns)
            else:
                records = [decode(row, anchor_ns) for row in rows]
                run = BucketSteps.of_records(records)
            where = placements(run)
        except _ROW_ERRORS:  # the per-step path says what is wrong with it
            kind = None
    if kind is None or run is None:
        yield rows, records, None
        return
    first = 0
    for index, group in groupby(where):
        stop = first + len(list(group))
        parts = None
        if index is not None:
            try:
                parts = bucket_parts(run.cut(first, stop), kind, index, previous_exit())
            except _ROW_ERRORS:
                parts = None
        yield rows[first:stop], None if records is None else records[first:stop], parts
        first = stop
