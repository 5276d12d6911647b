"""Stalls as events: a gap far longer than the rank's typical step, with a start, a length, ranks and a place.

Per rank, each step's *span* is its input wait plus its ``trace_step`` block plus the unnamed time
since the previous step (``traceml.between_steps.cpu_duration`` less the input wait; ``outside_step``
blocks are already left out of it, so they never make a stall). A step whose span exceeds the rank's
typical step time by more than ``max(STALL_FACTOR x p95, STALL_MIN_S)`` (:data:`STALL_FACTOR` = 5
times the rank's 95th-percentile step time, the hang watchdog's default factor; at least
:data:`STALL_MIN_S` = 1 s) is a stall candidate; the
first :data:`SKIP_STEPS` steps (start-up, compilation) are never candidates.

Candidates of several ranks that overlap in time are one event. In synchronous training one stuck rank
makes the others wait inside their collectives: a rank whose excess is mostly backward or exposed
collective time waited; the others are the culprits. When every rank in it only waited, their peer was
busy elsewhere (in an ``outside_step`` block such as a checkpoint, which is never a stall): no event,
unless a hang watchdog declared it.

The event is a ``HANG`` when a rank's hang watchdog declared a stall overlapping it (its ``rank-R.hang.json``,
resolved or not), and then carries the culprit's ``file:line``; otherwise a ``STALL``. Hang records that
no step shows (a stall after the last step, a run killed while hung) are events of their own.
Stalled steps are left out of the per-step means the rules read; their time is billed to ``stalled``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import BACKWARD, StepTiming
from traceml_otel.analyze.window import StepWindow
from traceml_otel.wire.hang_record import STATE_HUNG, HangRecord
from traceml_otel.wire.hang_verdict import combine

STALL_FACTOR = 5.0
"""A span longer than the typical step by this many times the rank's 95th-percentile step ... (the hang
watchdog's default ``TRACEML_HANG_FACTOR``: in a short run the p95 is one of its few slow steps, and a
factor of 10 let a 5 s stall among 0.6 s steps pass as a step when the watchdog had not fired) ..."""
STALL_PERCENTILE = 0.95
STALL_MIN_S = 1.0
"""... and by at least this many seconds is a stall."""
SKIP_STEPS = 3
"""A rank's first steps (start-up, compilation) are never stalls."""
WAITED_SHARE = 0.5
"""A rank whose excess is at least this share backward or collective time was waiting, not stuck."""
MAX_EVENTS = 64
"""Events kept (the longest); more are counted."""

STALL, HANG = "STALL", "HANG"


@dataclass(frozen=True, slots=True)
class RankStall:
    """One rank's part of a stall: the step it interrupted and the interval it made no progress."""

    rank: int
    step: int
    start: float
    """Unix seconds."""
    seconds: float
    waited: bool
    """The rank was waiting for another (its excess was in collectives)."""


@dataclass(frozen=True, slots=True)
class StallEvent:
    """A stall: when, how long, which ranks caused it and which waited, where, and which step."""

    kind: str
    """``STALL``, or ``HANG`` when a hang watchdog declared it."""
    start: float
    """Unix seconds."""
    seconds: float
    step: int | None
    """The step it interrupted (the culprit's)."""
    ranks: tuple[int, ...]
    """The culprit ranks."""
    waiting: tuple[int, ...] = ()
    location: str = ""
    """``file:line`` of the first culprit, from its hang record."""
    resolved: bool = True
    parts: tuple[RankStall, ...] = ()
    """Per rank: its interval (what the time account bills to ``stalled``)."""


@dataclass(frozen=True, slots=True)
class StallAnalysis:
    """The events, longest first, and how many more were left out."""

    events: tuple[StallEvent, ...] = ()
    left_out: int = 0

    def stalled_steps(self) -> frozenset[int]:
        """Step numbers a stall interrupted (on any rank): left out of the per-step means."""
        return frozenset(p.step for e in self.events for p in e.parts)


NO_STALLS = StallAnalysis()
"""No stall events (the default of a run analysis)."""


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _span(step: StepTiming) -> tuple[float, float, float, float]:
    """(begin, end, busy, gap): the step's input wait + block, and the unnamed time before it."""
    wait = step.input_wait_cpu or 0.0
    traced = step.traced_cpu or 0.0
    gap = max(0.0, (step.between_cpu or 0.0) - wait)
    start = step.start_unix_nano / 1e9
    return start - wait - gap, start + traced, wait + traced, gap


def _waited(step: StepTiming, excess: float, typical_backward: float) -> bool:
    backward = step.phase(BACKWARD, Clock.CPU) or 0.0
    comm = step.communication(Clock.CPU) or 0.0
    outside_backward = max(0.0, comm - step.phase_communication(BACKWARD, Clock.CPU))
    return (backward - typical_backward) + outside_backward >= WAITED_SHARE * excess


def rank_candidates(rank: int, steps: Sequence[StepTiming]) -> list[RankStall]:
    """One rank's stall candidates (see the module docstring)."""
    if len(steps) <= SKIP_STEPS + 2:
        return []
    spans = [_span(s) for s in steps]
    busy = [b + g for _, _, b, g in spans[SKIP_STEPS:]]
    high = _percentile(busy, STALL_PERCENTILE)
    typical = _percentile(busy, 0.5)
    limit = max(STALL_FACTOR * high, STALL_MIN_S)
    backwards = sorted(s.phase(BACKWARD, Clock.CPU) or 0.0 for s in steps)
    typical_backward = backwards[len(backwards) // 2]
    found = []
    for step, (_begin, end, b, g) in zip(steps[SKIP_STEPS:], spans[SKIP_STEPS:], strict=True):
        excess = b + g - typical
        if excess <= limit:
            continue
        waited = _waited(step, excess, typical_backward)
        found.append(RankStall(rank, step.step, end - excess, excess, waited))
    return found


def _record_intervals(record: HangRecord) -> list[tuple[float, float, int]]:
    """(start, end, step) of every stall a hang record names."""
    out = [(e.progress_at, e.resolved_at, e.step) for e in record.earlier]
    if record.written_at and record.stalled_s > 0:
        end = record.resolved_at or record.written_at
        out.append((record.written_at - record.stalled_s, max(end, record.written_at), record.step))
    return out


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return min(a1, b1) > max(a0, b0)


def _event(parts: list[RankStall], records: Sequence[HangRecord]) -> StallEvent:
    culprits = [p for p in parts if not p.waited] or parts
    lead = max(culprits, key=lambda p: p.seconds)
    start, end = min(p.start for p in parts), max(p.start + p.seconds for p in parts)
    hit = [r for r in records if any(_overlaps(a, b, start, end) for a, b, _ in _record_intervals(r))]
    kind, location, ranks, resolved = STALL, "", tuple(sorted({p.rank for p in culprits})), True
    if hit:
        kind = HANG
        resolved = all(r.state != STATE_HUNG for r in hit)
        verdict = combine([replace(r, state=STATE_HUNG) for r in hit])
        if verdict is not None and verdict.culprits:
            ranks = tuple(verdict.culprits) if not set(ranks) & set(verdict.culprits) else ranks
            location = verdict.location
        own = next((r for r in hit if r.rank == ranks[0] and r.location is not None), None)
        if own is not None and own.location is not None:
            location = own.location.where()
    waiting = tuple(sorted({p.rank for p in parts} - set(ranks)))
    return StallEvent(kind, start, lead.seconds, lead.step, ranks, waiting, location, resolved, tuple(parts))


def find_stalls(window: StepWindow, records: Sequence[HangRecord] = ()) -> StallAnalysis:
    """Stall events of ``window`` (its ranks' steps) and of the hang records no step shows."""
    return stall_events([c for rank, steps in zip(window.ranks, window.per_rank, strict=True)
                         for c in rank_candidates(rank, steps)], records)


def stall_candidate(rank: int, step: StepTiming, excess: float, typical_backward: float) -> RankStall:
    """A rank's stall candidate at ``step``, whose span exceeded the rank's typical one by ``excess``
    (the columnar engine finds them in SQL, :data:`~traceml_otel.analyze.columnar_sql.STALL_CANDIDATES`)."""
    _begin, end, _busy, _gap = _span(step)
    return RankStall(rank, step.step, end - excess, excess, _waited(step, excess, typical_backward))


def stall_events(found: Sequence[RankStall], records: Sequence[HangRecord] = ()) -> StallAnalysis:
    """Candidates overlapping in time grouped into events, with the hang records no step shows."""
    candidates = sorted(found, key=lambda c: (c.start, c.rank, c.step))
    groups: list[list[RankStall]] = []
    for cand in candidates:
        last = groups[-1] if groups else None
        if last and (cand.start < max(p.start + p.seconds for p in last)
                     or cand.step in {p.step for p in last}):
            last.append(cand)
        else:
            groups.append([cand])
    events = [_event(g, records) for g in groups]
    events = [e for e in events if e.kind == HANG or not all(p.waited for p in e.parts)]
    events += _record_only(records, events)
    events.sort(key=lambda e: -e.seconds)
    kept = tuple(sorted(events[:MAX_EVENTS], key=lambda e: e.start))
    return StallAnalysis(kept, max(0, len(events) - MAX_EVENTS))


def _record_only(records: Sequence[HangRecord], events: Sequence[StallEvent]) -> list[StallEvent]:
    """Events from hang records whose stalls no step-based event covers (grouped by overlap)."""
    loose: list[tuple[float, float, int, HangRecord]] = []
    for record in records:
        for a, b, step in _record_intervals(record):
            if not any(_overlaps(a, b, e.start, e.start + e.seconds) for e in events):
                loose.append((a, b, step, record))
    loose.sort(key=lambda item: item[0])
    out: list[StallEvent] = []
    group: list[tuple[float, float, int, HangRecord]] = []
    for item in [*loose, None]:
        if item is not None and (not group or item[0] < max(g[1] for g in group)):
            group.append(item)
            continue
        if group:
            recs = list({g[3].rank: g[3] for g in group}.values())
            verdict = combine([replace(r, state=STATE_HUNG) for r in recs])
            ranks = tuple(verdict.culprits) if verdict and verdict.culprits else tuple(r.rank for r in recs)
            start, end = min(g[0] for g in group), max(g[1] for g in group)
            lead = next((g for g in group if g[3].rank == ranks[0]), group[0])
            parts = tuple(RankStall(g[3].rank, g[2], g[0], g[1] - g[0], g[3].rank not in ranks)
                          for g in group)
            out.append(StallEvent(HANG, start, end - start, lead[2], ranks,
                                  tuple(sorted({r.rank for r in recs} - set(ranks))),
                                  verdict.location if verdict else "",
                                  all(r.state != STATE_HUNG for r in recs), parts))
        group = [item] if item is not None else []
    return out
