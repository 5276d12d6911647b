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
resolved or not), and then carries the culprit's ``file:line`` (the overlapping stall's own: an earlier
episode keeps its place); otherwise a ``STALL``. Hang records that no step shows (a run killed while
hung, also after its last step) are events of their own; a stall after its last step that the rank came
out of is quiet work at its end (shutdown), no event.
Stalled steps are left out of the per-step means the rules read; their time is billed to ``stalled``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from traceml_otel.analyze.busy_gaps import BUSY_SHARE, BusyGap, GapCpu
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
    gap: float = 0.0
    """Seconds of the excess that lie between steps (the unnamed time before the step)."""

    @property
    def between_steps(self) -> bool:
        """Whether most of the excess lies between steps, not in the step's input wait or block."""
        return self.gap >= self.seconds / 2


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
    """The events, longest first, and how many more were left out; the long gaps that were work."""

    events: tuple[StallEvent, ...] = ()
    left_out: int = 0
    busy_gaps: tuple[BusyGap, ...] = ()
    """Candidates between steps whose training thread was on a CPU (:mod:`~traceml_otel.analyze.busy_gaps`):
    no events, their time is between steps; the longest :data:`MAX_EVENTS` kept."""
    busy_gaps_left_out: int = 0
    waited_for_work: tuple[RankStall, ...] = ()
    """Other ranks' waits for a busy gap (a peer's unmarked evaluation) in their next collective: their
    steps are left out of the per-step means as a stall's are, and the time account bills the waits to
    ``stalled`` (they made no progress), though no event."""

    def stalled_steps(self) -> frozenset[int]:
        """Step numbers a stall interrupted (on any rank), or in which ranks waited for a peer's busy
        gap: left out of the per-step means."""
        waits = {p.step for p in self.waited_for_work}
        return frozenset(p.step for e in self.events for p in e.parts) | waits


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
        found.append(RankStall(rank, step.step, end - excess, excess, waited, min(g, excess)))
    return found


@dataclass(frozen=True, slots=True)
class _RecordStall:
    """One stall a hang record names: its own (current or last) or an earlier episode."""

    start: float
    end: float
    step: int
    where: str
    """``file:line`` of this stall (an episode's own place, not the record's latest)."""
    own: bool


def _record_intervals(record: HangRecord) -> list[_RecordStall]:
    """Every stall a hang record names."""
    out = [_RecordStall(e.progress_at, e.resolved_at, e.step, e.where, False) for e in record.earlier]
    if record.written_at and record.stalled_s > 0:
        end = record.resolved_at or record.written_at
        where = record.location.where() if record.location is not None else ""
        out.append(_RecordStall(record.written_at - record.stalled_s, max(end, record.written_at),
                                record.step, where, True))
    return out


def before_the_end(records: Sequence[HangRecord], last_steps: Mapping[int, int]) -> list[HangRecord]:
    """The records less the stalls a rank came out of after its last step (``last_steps``: each rank's
    last step number): quiet work at the end (a final save not marked ``outside_step``) the rank ended
    cleanly after, billed to shutdown (:mod:`~traceml_otel.analyze.time_accounting`), never a ``HANG``.
    A record still hung there (a rank killed stuck in its teardown) stays."""
    out = []
    for record in records:
        last = last_steps.get(record.rank)
        if last is None:
            out.append(record)
            continue
        earlier = tuple(e for e in record.earlier if e.step <= last)
        if record.state != STATE_HUNG and record.step > last and not record.in_step:
            record = replace(record, stalled_s=0.0)
        out.append(replace(record, earlier=earlier) if len(earlier) != len(record.earlier) else record)
    return out


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return min(a1, b1) > max(a0, b0)


def _event(parts: list[RankStall], records: Sequence[HangRecord]) -> StallEvent:
    culprits = [p for p in parts if not p.waited] or parts
    lead = max(culprits, key=lambda p: p.seconds)
    start, end = min(p.start for p in parts), max(p.start + p.seconds for p in parts)
    stalls = {r.rank: [i for i in _record_intervals(r) if _overlaps(i.start, i.end, start, end)]
              for r in records}
    hit = [r for r in records if stalls[r.rank]]
    kind, location, ranks, resolved = STALL, "", tuple(sorted({p.rank for p in culprits})), True
    if hit:
        kind = HANG
        # an earlier episode has ended; the record's own stall has when the record says so
        resolved = all(not (i.own and r.state == STATE_HUNG) for r in hit for i in stalls[r.rank])
        verdict = combine([replace(r, state=STATE_HUNG) for r in hit])
        if verdict is not None and verdict.culprits:
            ranks = tuple(verdict.culprits) if not set(ranks) & set(verdict.culprits) else ranks
            location = verdict.location
        own = next((i for i in stalls.get(ranks[0], ()) if i.where), None)
        if own is not None:
            location = own.where
        elif any(not i.own for i in stalls.get(ranks[0], ())):
            location = ""  # an earlier episode of a record that kept no place for it
    waiting = tuple(sorted({p.rank for p in parts} - set(ranks)))
    return StallEvent(kind, start, lead.seconds, lead.step, ranks, waiting, location, resolved, tuple(parts))


def find_stalls(
    window: StepWindow, records: Sequence[HangRecord] = (), cpu: GapCpu | None = None,
) -> StallAnalysis:
    """Stall events of ``window`` (its ranks' steps) and of the hang records no step shows; with the
    ranks' CPU samples (``cpu``), the long gaps between steps their training threads worked through."""
    ranked = list(zip(window.ranks, window.per_rank, strict=True))
    last_steps = {rank: max(s.step for s in steps) for rank, steps in ranked if steps}
    found = [c for rank, steps in ranked for c in rank_candidates(rank, steps)]
    busy = None
    if cpu is not None and found:
        numbers = {rank: sorted(s.step for s in steps) for rank, steps in ranked}

        def busy(cand: RankStall) -> float | None:  # steps ended before the candidate's: its gap's count
            return cpu.share(cand.rank, bisect_left(numbers[cand.rank], cand.step))
    return stall_events(found, records, last_steps, busy)


def stall_candidate(rank: int, step: StepTiming, excess: float, typical_backward: float) -> RankStall:
    """A rank's stall candidate at ``step``, whose span exceeded the rank's typical one by ``excess``
    (the columnar engine finds them in SQL, :data:`~traceml_otel.analyze.columnar_sql.STALL_CANDIDATES`)."""
    _begin, end, _busy, gap = _span(step)
    waited = _waited(step, excess, typical_backward)
    return RankStall(rank, step.step, end - excess, excess, waited, min(gap, excess))


def stall_events(
    found: Sequence[RankStall], records: Sequence[HangRecord] = (),
    last_steps: Mapping[int, int] | None = None, busy: Callable[[RankStall], float | None] | None = None,
) -> StallAnalysis:
    """Candidates overlapping in time grouped into events, with the hang records no step shows.
    ``last_steps``: each rank's last step number; stalls a rank came out of after it are no events
    (:func:`before_the_end`). ``busy``: a candidate's training thread's on-CPU share (``None``: not
    known); a candidate between steps that worked is a busy gap, no event (:mod:`.busy_gaps`)."""
    if last_steps:
        records = before_the_end(records, last_steps)
    found, gaps = _busy_gaps(found, records, busy)
    waiters = [c for c in found if c.waited and any(_overlaps(g.start, g.start + g.seconds, c.start,
                                                              c.start + c.seconds) for g in gaps)]
    found = [c for c in found if c not in waiters]  # they waited for a peer's work: no stall either
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
    gaps.sort(key=lambda g: -g.seconds)
    kept_gaps = tuple(sorted(gaps[:MAX_EVENTS], key=lambda g: g.start))
    return StallAnalysis(kept, max(0, len(events) - MAX_EVENTS), kept_gaps, max(0, len(gaps) - MAX_EVENTS),
                         tuple(waiters[:MAX_EVENTS * 16]))


def _busy_gaps(
    found: Sequence[RankStall], records: Sequence[HangRecord],
    busy: Callable[[RankStall], float | None] | None,
) -> tuple[list[RankStall], list[BusyGap]]:
    """(the candidates that stay stalls, the gaps between steps the training thread worked through). A
    gap a hang watchdog declared stays a stall: its record names it."""
    if busy is None:
        return list(found), []
    declared = [(i.start, i.end) for r in records for i in _record_intervals(r)]
    kept: list[RankStall] = []
    gaps: list[BusyGap] = []
    for cand in found:
        share = busy(cand) if cand.between_steps else None
        watched = any(_overlaps(a, b, cand.start, cand.start + cand.seconds) for a, b in declared)
        if share is None or share < BUSY_SHARE or watched:
            kept.append(cand)
        else:
            gaps.append(BusyGap(cand.rank, cand.step, cand.start, cand.seconds, share))
    return kept, gaps


def _record_only(records: Sequence[HangRecord], events: Sequence[StallEvent]) -> list[StallEvent]:
    """Events from hang records whose stalls no step-based event covers (grouped by overlap)."""
    loose: list[tuple[_RecordStall, HangRecord]] = []
    for record in records:
        for stall in _record_intervals(record):
            if not any(_overlaps(stall.start, stall.end, e.start, e.start + e.seconds) for e in events):
                loose.append((stall, record))
    loose.sort(key=lambda item: item[0].start)
    out: list[StallEvent] = []
    group: list[tuple[_RecordStall, HangRecord]] = []
    for item in [*loose, None]:
        if item is not None and (not group or item[0].start < max(g[0].end for g in group)):
            group.append(item)
            continue
        if group:
            recs = list({g[1].rank: g[1] for g in group}.values())
            verdict = combine([replace(r, state=STATE_HUNG) for r in recs])
            ranks = tuple(verdict.culprits) if verdict and verdict.culprits else tuple(r.rank for r in recs)
            start, end = min(g[0].start for g in group), max(g[0].end for g in group)
            lead = next((g[0] for g in group if g[1].rank == ranks[0]), group[0][0])
            location = verdict.location if verdict and lead.own else lead.where
            parts = tuple(RankStall(r.rank, g.step, g.start, g.end - g.start, r.rank not in ranks)
                          for g, r in group)
            out.append(StallEvent(HANG, start, end - start, lead.step, ranks,
                                  tuple(sorted({r.rank for r in recs} - set(ranks))), location,
                                  all(not (g.own and r.state == STATE_HUNG) for g, r in group), parts))
        group = [item] if item is not None else []
    return out
