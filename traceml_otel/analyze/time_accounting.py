"""Where every second of each rank went, from its process start to its end (``docs/goodput.md``).

Inputs: the step spans (:class:`StepTiming`), each rank's ``rank-R.time.json`` (process start and
end, ``outside_step`` totals), its hang record (stalled time) and the manifest (launch and end).
Per rank the timeline is cut at the first step's input fetch and the last step's end:

- ``startup``: from the launch to the first step's input fetch, less ``outside_step`` time and
  stalls there; and the start-up steps the analyzer left out of its means (a ``torch.compile`` step 0:
  :mod:`~traceml_otel.analyze.startup_steps`);
- ``step.*``: each step's input wait plus its block, split as the diagnosis splits it;
- ``outside.<kind>``: each ``outside_step`` kind;
- ``between_steps``: the rest of the training window (code between steps that nothing named);
- ``stalled``: no progress, every stall the hang record names (its earlier episodes and its own),
  each carved out of where it happened, overlaps counted once;
- ``shutdown``: from the last step's end to the process end, less ``outside_step`` time and stalls;
- ``telemetry``: telemetry's own time at the end (the last hand-off, the final export, the metrics
  endpoint's linger), taken out of what would otherwise be ``shutdown``; and the end-of-run diagnosis
  that ``traceml run`` made after the job's end (the manifest's ``diagnosis_s``), added after it.

The categories add up to the rank's wall time by construction; where measurements overlap (a
negative remainder) the remainder is clamped to 0 and a note says so.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import BACKWARD, FORWARD, H2D, OPTIMIZER, StepTiming
from traceml_otel.contract import rank_of_file, time_file_name
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.time_record import TimeRecord, read_time_record

STARTUP = "startup"
RESTARTS = "restarts"
"""Under torchrun's restarts: from the earlier attempt's last step to this attempt's process start (the
failure, the teardown and the restart), or every earlier attempt whole when none of its steps is seen."""
REDONE_STEPS = "redone_steps"
"""A restarted attempt's steps that redo steps an earlier attempt had done (``traceml.resume_from``)."""
BETWEEN_STEPS = "between_steps"
STALLED = "stalled"
SHUTDOWN = "shutdown"
TELEMETRY = "telemetry"
"""Telemetry's own time at the end of a rank (``TimeRecord.telemetry_s``): never the program's
shutdown, and no advice about checkpoints."""
STEP_PARTS = ("input_wait", "h2d", "forward", "backward", "optimizer", "communication", "residual")
PRODUCTIVE = frozenset(f"step.{part}" for part in STEP_PARTS if part != "input_wait")
"""Goodput's numerator: the time inside step blocks, stalls excluded (see ``docs/goodput.md``)."""
MAX_TIME_RECORDS = 4096
FINDING_SHARE = 0.10
"""A non-productive category at or above this share of the job's wall time is a finding."""
MAX_FINDINGS = 3


@dataclass(frozen=True, slots=True)
class RankTime:
    """One rank's wall time by category (seconds, in report order)."""

    rank: int
    wall_s: float
    categories: tuple[tuple[str, float], ...]
    goodput: float | None
    exit_s: float = 0.0
    """The part of ``shutdown`` after telemetry's end: the interpreter's exit (its libraries'
    teardown; 1-2 s with torch) and, under ``traceml run``, the launcher seeing it."""

    def seconds(self, name: str) -> float:
        """Seconds of one category (0 when absent)."""
        return next((value for key, value in self.categories if key == name), 0.0)


@dataclass(frozen=True, slots=True)
class TimeFinding:
    """A non-productive category that takes a large share of the job's wall time, and what to do."""

    category: str
    share: float
    seconds: float
    text: str
    advice: str


@dataclass(frozen=True, slots=True)
class TimeAccount:
    """The job's time by category, summed over ranks, with each rank's own account."""

    wall_s: float
    categories: tuple[tuple[str, float], ...]
    goodput: float | None
    ranks: tuple[RankTime, ...]
    findings: tuple[TimeFinding, ...] = ()
    notes: tuple[str, ...] = ()


def read_time_records(run_dir: Path) -> tuple[dict[int, TimeRecord], list[str]]:
    """Every rank's ``rank-R.time.json`` in ``run_dir`` (bounded); problems returned, never raised."""
    records: dict[int, TimeRecord] = {}
    problems: list[str] = []
    try:
        names = sorted(e.name for e in os.scandir(run_dir) if e.name.endswith(".time.json"))
        names = names[:MAX_TIME_RECORDS]
    except OSError as error:
        return records, [f"{run_dir}: cannot list time records ({type(error).__name__})"]
    for name in names:
        rank = rank_of_file(name, time_file_name)
        if rank is None:
            continue
        try:
            records[rank] = read_time_record(Path(run_dir) / name)
        except (RecordError, ValueError) as error:
            problems.append(f"{name}: {error}")
    return records, problems


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _step_parts(step: StepTiming) -> tuple[float, ...]:
    """The step's input wait and block split like the diagnosis (CPU clock, the wall clock)."""
    wait = step.waited_cpu
    traced = step.traced_cpu or 0.0
    phase = [step.phase(i, Clock.CPU) or 0.0 for i in (H2D, FORWARD, BACKWARD, OPTIMIZER)]
    comm_in = [step.phase_communication(i, Clock.CPU) for i in (H2D, FORWARD, BACKWARD, OPTIMIZER)]
    own = [max(0.0, p - c) for p, c in zip(phase, comm_in, strict=True)]
    communication = step.communication(Clock.CPU) or 0.0
    named = sum(own) + communication
    if named > traced > 0:  # overlapping measurements: scale them into the block
        own, communication = [p * traced / named for p in own], communication * traced / named
        named = traced
    return (wait, *own, communication, max(0.0, traced - named))


class _RankBuilder:
    """Accumulates one rank's steps in order and closes its account."""

    __slots__ = ("first", "last_end", "parts", "spans", "stall_cuts", "steps")

    def __init__(self) -> None:
        self.parts = [0.0] * len(STEP_PARTS)
        self.first: float | None = None
        self.last_end: float | None = None
        self.steps = 0
        self.spans: list[tuple[float, float, int]] = []
        self.stall_cuts: list[tuple[float, float]] = []

    def add(self, step: StepTiming) -> None:
        parts = _step_parts(step)
        for index, value in enumerate(parts):
            self.parts[index] += value
        start = step.start_unix_nano / 1e9
        end = start + (step.traced_cpu or 0.0)
        begin = start - parts[0]
        self.first = begin if self.first is None else min(self.first, begin)
        self.last_end = end if self.last_end is None else max(self.last_end, end)
        self.steps += 1
        self.spans.append((begin, end, step.step))


def _cut_at_step(
    since: float, stop: float, number: object, in_step: object, steps: dict[int, tuple[float, float]],
) -> tuple[float, float]:
    """A stall cut at the end of the step it stalled in (or the start of the next step): the
    watchdog sees progress one tick late."""
    span = steps.get(number) if isinstance(number, int) else None
    if span is not None:
        stop = min(stop, max(since, span[1] if in_step else span[0]))
    return since, stop


def _stall_intervals(
    hang: object, end: float, spans: Sequence[tuple[float, float, int]], last: float,
) -> tuple[list[tuple[float, float]], list[tuple[float, str]]]:
    """Every stall the hang record names: its earlier resolved episodes, and its own from the last
    progress the watchdog saw to the resolution (or the rank's end), each cut at its step; and the
    parts of them left out as quiet work after the last step, with their places. A resolved stall ends
    by the rank's ``last`` step end: quiet work after the last step that the rank came out of (a final
    save not marked ``outside_step``, a slow exit) is shutdown; a record still hung at the end (a rank
    killed while stuck in its teardown) stays stalled."""
    earlier = getattr(hang, "earlier", ()) or ()
    wanted = {getattr(hang, "step", None), *(e.step for e in earlier)}  # only the stalls' steps are looked up
    steps: dict[int, tuple[float, float]] = {}
    for begin, step_end, step in spans:
        if step in wanted:
            steps.setdefault(step, (begin, step_end))
    resolved_stalls: list[tuple[float, float, object, bool, str]] = [  # (since, until, step, in it, where)
        (e.progress_at, e.resolved_at, e.step, e.in_step, e.where) for e in earlier]
    intervals: list[tuple[float, float]] = []
    written, stalled = getattr(hang, "written_at", 0.0), getattr(hang, "stalled_s", 0.0)
    if written and stalled is not None and stalled > 0:
        resolved = getattr(hang, "resolved_at", None)
        number, in_step = getattr(hang, "step", None), getattr(hang, "in_step", False)
        if resolved:
            location = getattr(hang, "location", None)
            where = location.where() if location is not None else ""
            resolved_stalls.append((written - stalled, max(written, resolved), number, in_step, where))
        else:
            intervals.append(_cut_at_step(written - stalled, max(written, end), number, in_step, steps))
    after_last = []
    for since, stop, number, in_step, where in resolved_stalls:
        intervals.append(_cut_at_step(since, min(stop, last), number, in_step, steps))
        if stop > last:
            after_last.append((stop - max(since, last), where))
    return intervals, after_last


def _quiet_after_last_step(rank: int, quiet: Sequence[tuple[float, str]]) -> str | None:
    """A note for the stalls after the rank's last step end that it came out of (``quiet``: their
    seconds and places, billed to ``shutdown`` by :func:`_stall_intervals`); ``None`` when none."""
    seconds = sum(s for s, _ in quiet)
    if seconds < 0.05:
        return None
    places = sorted({where for _, where in quiet if where})
    at = f", at {', '.join(places[:3])}" if places else ""
    return (f"rank {rank}: {seconds:.1f} s without progress after its last step{at} (the hang watchdog "
            "reported it; the rank came out of it and ended): work of its shutdown, billed to shutdown; "
            'name a final save with traceml.outside_step("checkpoint")')


def _merged(intervals: Iterable[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The intervals within [``start``, ``end``], sorted, overlapping ones joined (never counted twice)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlap_with_spans(
    stalls: list[tuple[float, float]], spans: Sequence[tuple[float, float, int]],
) -> float:
    """Seconds of the (sorted, disjoint) stalls inside the step spans: a bisection per span."""
    if not stalls:
        return 0.0
    starts = [a for a, _ in stalls]
    total = 0.0
    for begin, end, _ in spans:
        index = bisect.bisect_left(starts, end) - 1
        while index >= 0 and stalls[index][1] > begin:
            total += _overlap(*stalls[index], begin, end)
            index -= 1
    return total


def _carve(parts: list[float], seconds: float) -> None:
    """Take ``seconds`` of stall out of the step parts, largest first (where the rank sat while stalled)."""
    for index in sorted(range(len(parts)), key=parts.__getitem__, reverse=True):
        cut = min(parts[index], seconds)
        parts[index] -= cut
        seconds -= cut
        if seconds <= 0:
            return


def _restarts(
    spans: Sequence[tuple[float, float, int]], record: TimeRecord, start: float,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], float]:
    """A restarted rank: (every restart's gap, from the attempt before's last step, or its start when
    it made none, to the restarted process's start; each restarted attempt's start-up, from its
    process start to its first step; the seconds of this attempt's first steps that redo steps an
    earlier attempt had done). Every restarted attempt's start is in the record
    (``earlier_restart_starts`` and this one's), so a second restart's gap is a restart too."""
    starts = sorted(t for t in (*record.earlier_restart_starts, record.process_start) if t and t > start)
    ends = sorted(end for _, end, _ in spans)
    begins = sorted(begin for begin, _, _ in spans)
    gaps: list[tuple[float, float]] = []
    startups: list[tuple[float, float]] = []
    previous = start
    for index, began in enumerate(starts):
        later = starts[index + 1] if index + 1 < len(starts) else float("inf")
        before = bisect.bisect_right(ends, began)
        gaps.append((max(ends[before - 1] if before else previous, previous), began))
        after = bisect.bisect_left(begins, began)
        if after < len(begins) and begins[after] < later:
            startups.append((began, begins[after]))
        previous = began
    this = sorted((begin, end) for begin, end, _ in spans if begin >= (record.process_start or 0.0))
    count = 0 if record.resumed_from is None else max(0, record.earlier_progress - record.resumed_from)
    return gaps, startups, sum(end - begin for begin, end in this[:count])


def _take_share(parts: list[float], seconds: float) -> None:
    """Take ``seconds`` out of the step parts in proportion (the redone steps' share of each)."""
    total = sum(parts)
    if total > 0 and seconds > 0:
        keep = max(0.0, 1 - seconds / total)
        parts[:] = [part * keep for part in parts]


def _place_left_out(
    rank: int, hang: object, between: float, stalled: float, parts: list[float], notes: list[str],
) -> tuple[float, float]:
    """Stalls beyond the hang record's bound (only their count and seconds are kept) count as stalled,
    taken out of ``between_steps`` (then the step parts); returns the new (between, stalled)."""
    count = getattr(hang, "earlier_left_out", 0) or 0
    seconds = getattr(hang, "earlier_left_out_s", 0.0) or 0.0
    if seconds <= 0:
        return between, stalled
    from_between = min(seconds, max(0.0, between))
    from_steps = min(seconds - from_between, sum(parts))
    _carve(parts, from_steps)
    placed = from_between + from_steps
    text = (f"rank {rank}: {count} earlier stall(s) beyond the hang record's list ({seconds:.1f} s; "
            f"where they happened is not kept) counted as stalled, taken from between steps"
            f"{' and the steps' if from_steps > 0 else ''}")
    if seconds - placed > 0.05:
        text += f"; {seconds - placed:.1f} s of them found no time left there and are not counted"
    notes.append(text)
    return between - from_between, stalled + placed


def account_rank(
    rank: int, steps: Sequence[StepTiming], record: TimeRecord | None, hang: object | None,
    launched_at: float | None, manifest_end: float | None, stall_events: Sequence[tuple[float, float]] = (),
    after_end_s: float = 0.0, startup_through: int | None = None,
) -> tuple[RankTime, list[str]]:
    """One rank's account (see the module docstring) and notes about what it had to assume.
    ``startup_through``: the last of the run's start-up steps (a compile), billed to ``startup``.

    ``launched_at``/``manifest_end``: when ``traceml run`` started and ended (``None`` for a direct
    launch); with them a rank's start-up includes the launcher's and its shutdown lasts to the job's end.
    """
    notes: list[str] = []
    builder = _RankBuilder()
    for step in sorted(steps, key=lambda s: s.start_unix_nano):
        builder.add(step)
    starts = [t for t in (record.process_start if record else None, launched_at,
                          record.launcher_start if record else None) if t]
    if record is not None and not record.process_start:
        notes.append(f"rank {rank}: process start unknown; start-up counted from the launch record")
    if not starts and record is not None and record.init_at:
        starts = [record.init_at]
    first = builder.first if builder.first is not None else (record.init_at if record else None)
    start = min(starts) if starts else first
    ends = [manifest_end or 0.0, (record.ended_at or record.written_at or 0.0) if record else 0.0]
    if record is not None and not record.ended_at:
        notes.append(f"rank {rank}: no clean end recorded; its end is taken from its last record or the "
                     "launcher's")
    last = builder.last_end if builder.last_end is not None else first
    end = max([t for t in (*ends, last) if t], default=None)
    if start is None or end is None or first is None or last is None:
        return RankTime(rank, 0.0, (), None), [f"rank {rank}: no step and no time record; not accounted"]
    if record is not None and record.steps > builder.steps:
        missing = record.steps - builder.steps
        notes.append(f"rank {rank}: {missing} of its {record.steps} steps are missing from the spans "
                     "(sampled or lost): their time counts as between steps")
    outside = record.outside if record is not None else ()
    before = sum(o.before_first_step_s for o in outside)
    after = sum(o.after_last_step_s for o in outside)
    middle = max(0.0, sum(o.seconds for o in outside) - before - after)
    found, after_last = _stall_intervals(hang, end, builder.spans, last) if hang is not None else ([], [])
    quiet = _quiet_after_last_step(rank, after_last)
    if quiet:
        notes.append(quiet)
    stalls = _merged([*found, *stall_events], start, end)  # the analyzer's stall events too (stalls.py)
    parts = list(builder.parts)
    stalled = sum(b - a for a, b in stalls)
    stall_start = sum(_overlap(a, b, start, first) for a, b in stalls)
    stall_end = sum(_overlap(a, b, last, end) for a, b in stalls)
    stall_steps = min(_overlap_with_spans(stalls, builder.spans), sum(parts))
    _carve(parts, stall_steps)
    window = last - first
    between = window - sum(builder.parts) - middle - max(0.0, stalled - stall_start - stall_end - stall_steps)
    startup = (first - start) - before - stall_start
    if startup_through is not None:  # the start-up steps (analyze/startup_steps.py): a compile is no goodput
        early = [_step_parts(step) for step in steps if step.step <= startup_through]
        for index in range(len(parts)):
            moved = min(parts[index], sum(p[index] for p in early))
            parts[index] -= moved
            startup += moved
    restarts = redone = 0.0
    if record is not None and record.restart > 0 and record.process_start and record.process_start > start:
        gaps, startups, redone = _restarts(builder.spans, record, start)
        in_window = sum(_overlap(a, b, first, last) for a, b in gaps)  # out of between_steps
        before_first = sum(_overlap(a, b, start, first) for a, b in gaps)  # out of start-up
        carried = record.earlier_after_last_step_s  # earlier attempts' outside_step time in the gaps
        restarts = max(0.0, in_window + before_first - carried)
        attempt_startups = sum(_overlap(a, b, first, last) for a, b in startups)
        startup += attempt_startups - before_first
        between -= max(0.0, in_window - carried) + attempt_startups
        _take_share(parts, redone)
    between, stalled = _place_left_out(rank, hang, between, stalled, parts, notes)
    shutdown = (end - last) - after - stall_end
    telemetry = min(record.telemetry_s, max(0.0, shutdown)) if record is not None else 0.0
    shutdown -= telemetry
    telemetry += max(0.0, after_end_s)  # the diagnosis after the job's end: the job still held its machines
    exit_s = min(max(0.0, shutdown), end - record.ended_at) if record is not None and record.ended_at else 0.0
    for name, value in (("between steps", between), ("start-up", startup), ("shutdown", shutdown)):
        if value < -0.05:
            notes.append(f"rank {rank}: {name} came out at {value:.2f} s (overlapping records); shown as 0")
    categories = [(RESTARTS, restarts)] if restarts else []
    categories += [(REDONE_STEPS, redone)] if redone else []
    categories += [(STARTUP, max(0.0, startup))]
    categories += [(f"step.{name}", value) for name, value in zip(STEP_PARTS, parts, strict=True)]
    categories += [(f"outside.{o.kind}", o.seconds) for o in outside]
    categories += [(BETWEEN_STEPS, max(0.0, between)), (STALLED, stalled), (SHUTDOWN, max(0.0, shutdown))]
    categories += [(TELEMETRY, telemetry)] if telemetry else []
    wall = end - start + max(0.0, after_end_s)
    productive = sum(value for name, value in categories if name in PRODUCTIVE)
    return RankTime(rank, wall, tuple(categories), productive / wall if wall > 0 else None,
                    max(0.0, exit_s)), notes


def _advice(category: str, seconds: float, exit_s: float = 0.0) -> tuple[str, str]:
    """The finding's name for ``category`` and what to do about it (``exit_s``: the part of the
    shutdown after telemetry's end, the interpreter's exit)."""
    if category == RESTARTS:
        return "earlier attempts (restarts)", ("find why the earlier attempts failed (the manifest and hang "
                                               "records), and checkpoint more often so a restart redoes less")
    if category == REDONE_STEPS:
        return "steps redone after a restart", ("checkpoint more often (or asynchronously) so a restart "
                                                "resumes closer to where the failed attempt stopped")
    if category == STARTUP:
        return "start-up", ("cache the dataset and compiled kernels, load checkpoints and imports lazily, "
                            "or run longer jobs so start-up is amortised")
    if category == "outside.evaluation":
        return "evaluation", "evaluate less often or on fewer batches"
    if category == "outside.checkpoint":
        return "checkpoints", ("checkpoint less often, or save asynchronously "
                               "(torch.distributed.checkpoint.async_save)")
    if category.startswith("outside."):
        kind = category.removeprefix("outside.")[:40]
        return f"'{kind}' blocks", f"run the '{kind}' work less often or make it cheaper"
    if category == BETWEEN_STEPS:
        return "time between steps", ("code between steps runs outside every step and outside_step block: "
                                      "wrap it in traceml.outside_step(kind) to name it, or move per-step "
                                      "logging and host syncs (.item(), printing) off the training loop")
    if category == STALLED:
        return "stalled time", ("ranks made no progress: see the STALL and HANG findings for when, which "
                                "rank and where")
    if category == TELEMETRY:
        return "telemetry's own time", ("the final export, the metrics endpoint's linger "
                                        "(TRACEML_PROMETHEUS_LINGER_S; 0 turns it off) and traceml run's "
                                        "diagnosis (--no-report skips it): not your program's")
    if category == SHUTDOWN and exit_s >= seconds / 2:
        return "shutdown", ("mostly the process's exit after its last step and telemetry's end (the "
                            "interpreter and its libraries' teardown, 1-2 s with torch): run longer jobs "
                            "so it is amortised")
    if category == SHUTDOWN:
        return "shutdown", ("time after the last step (final saves, teardown): make the final checkpoint "
                            "asynchronous")
    return "input wait", "the loader holds steps up: see the diagnosis (INPUT_BOUND) for the fix"


def _findings(
    categories: Iterable[tuple[str, float]], wall: float, exit_s: float = 0.0,
) -> tuple[TimeFinding, ...]:
    found = []
    for name, seconds in sorted(categories, key=lambda item: -item[1]):
        share = seconds / wall if wall > 0 else 0.0
        if name in PRODUCTIVE or share < FINDING_SHARE:
            continue
        label, advice = _advice(name, seconds, exit_s)
        text = f"{label} takes {share * 100:.0f} % of wall time"
        found.append(TimeFinding(name, share, seconds, text, advice))
    return tuple(found[:MAX_FINDINGS])


def account_time(
    steps: Iterable[StepTiming], records: dict[int, TimeRecord], hangs: Iterable[object] = (),
    launched_at: float | None = None, manifest_end: float | None = None,
    stalls: dict[int, list[tuple[float, float]]] | None = None, after_end_s: float = 0.0,
    startup_through: int | None = None,
) -> TimeAccount | None:
    """The job's account: every rank that has steps or a time record; ``None`` when none has either.

    ``stalls``: per rank, the intervals of the analyzer's stall events (billed to ``stalled``);
    ``after_end_s``: telemetry's own time after the job's end (``traceml run``'s diagnosis);
    ``startup_through``: the last start-up step the analyzer left out (billed to ``startup``)."""
    by_rank: dict[int, list[StepTiming]] = defaultdict(list)
    for step in steps:
        by_rank[step.rank].append(step)
    hang_by_rank = {getattr(h, "rank", -1): h for h in hangs}
    ranks, notes = [], []
    for rank in sorted(set(by_rank) | set(records)):
        rank_time, rank_notes = account_rank(rank, by_rank.get(rank, ()), records.get(rank),
                                             hang_by_rank.get(rank), launched_at, manifest_end,
                                             (stalls or {}).get(rank, ()), after_end_s, startup_through)
        notes.extend(rank_notes)
        if rank_time.wall_s > 0:
            ranks.append(rank_time)
    if not ranks:
        return None
    totals: dict[str, float] = {}
    for rank_time in ranks:
        for name, value in rank_time.categories:
            totals[name] = totals.get(name, 0.0) + value
    wall = sum(r.wall_s for r in ranks)
    productive = sum(value for name, value in totals.items() if name in PRODUCTIVE)
    missing = sorted(set(by_rank) - set(records))
    if missing:
        notes.insert(0, f"{len(missing)} rank(s) without a time record (e.g. rank {missing[0]}): start-up, "
                        "outside_step time and shutdown are unknown there (counted as between steps or "
                        "not at all)")
    return TimeAccount(wall, tuple(totals.items()), productive / wall if wall > 0 else None, tuple(ranks),
                       _findings(totals.items(), wall, sum(r.exit_s for r in ranks)), tuple(notes[:20]))
