"""What the events and segments add to the run's findings: stall findings, recurrence, drift by segment."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise

from traceml_otel.analyze.findings import DriftAnalysis, Evidence, Finding, StepDiagnosis, WorstStep
from traceml_otel.analyze.kinds import DriftKind, RunKind, Severity
from traceml_otel.analyze.recurrence import NONE, StragglerRecurrence, culprit_of
from traceml_otel.analyze.segments import FAST, SLOW, STEADY, WARM_UP, SegmentAnalysis, pace_apart
from traceml_otel.analyze.stalls import HANG, StallAnalysis, StallEvent
from traceml_otel.analyze.time_accounting import STALLED, TimeAccount

MAX_STALL_FINDINGS = 5
"""Stall events shown as findings (the longest); the rest are counted in the last one's text."""


def median_series(per_rank: Sequence[Sequence[float | None]]) -> list[float]:
    """Per aligned step the median over ranks of the known step times (a step none knows repeats the last)."""
    out: list[float] = []
    for column in zip(*per_rank, strict=True):
        known = [v for v in column if v is not None]
        out.append(statistics.median(known) if known else (out[-1] if out else 0.0))
    return out


def _ranks(ranks: Sequence[int]) -> str:
    names = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {names}"


def stall_finding(event: StallEvent) -> Finding:
    """The ``STALL`` (or resolved ``HANG``) finding of one event."""
    where = f" at {event.location}" if event.location else ""
    step = f" in step {event.step}" if event.step is not None else ""
    who = _ranks(event.ranks)
    title = f"{'Hang' if event.kind == HANG else 'Stall'}: {who} stopped {event.seconds:.1f} s{step}"
    why = (f"{who.capitalize()} made no progress for {event.seconds:.1f} s{where}{step}, far longer than a "
           "typical step, then went on")
    why += f"; {_ranks(event.waiting)} waited for it." if event.waiting else "."
    if event.kind == HANG:
        why += " The hang watchdog declared it" + (" and saw it resolve." if event.resolved else ".")
    evidence = [Evidence("stalled", round(event.seconds, 3), "s"),
                Evidence("start", round(event.start, 3), "s"),
                Evidence("culprit_rank", event.ranks[0] if event.ranks else None, "rank")]
    if event.step is not None:
        evidence.append(Evidence("step", event.step))
    if event.location:
        evidence.append(Evidence("location", event.location))
    if event.waiting:
        evidence.append(Evidence("waiting_ranks", str(list(event.waiting[:64]))))
    return Finding(
        kind=RunKind.HANG if event.kind == HANG else RunKind.STALL,
        severity=Severity.WARNING, score=None, title=title, why=why,
        next=("Look at what the culprit did there" + (f" ({event.location})" if event.location else "") +
              ": a blocking read, a lock, a host sync or a slow file system; its steps are left out of the "
              "per-step means and its time is billed to 'stalled'."),
        evidence=tuple(evidence),
    )


def stall_findings(stalls: StallAnalysis) -> tuple[Finding, ...]:
    """Findings of the resolved events, longest first (an unresolved hang is the HANG finding itself)."""
    shown = sorted((e for e in stalls.events if e.resolved), key=lambda e: -e.seconds)
    found = [stall_finding(e) for e in shown[:MAX_STALL_FINDINGS]]
    more = len(shown) - MAX_STALL_FINDINGS + stalls.left_out
    if found and more > 0:
        found[-1] = replace(found[-1], why=found[-1].why + f" ({more} more stall events not shown.)")
    return tuple(found)


def stalled_advice(account: TimeAccount | None, findings: Sequence[Finding],
                   waited_for_work: bool = False) -> TimeAccount | None:
    """``account`` whose ``stalled`` advice names only the stall findings the report holds
    (``waited_for_work``: ranks waited for a peer's unmarked work between steps, said in a note)."""
    if account is None:
        return None
    kinds = [kind for kind in (RunKind.HANG, RunKind.STALL) if any(f.kind == kind for f in findings)]
    if kinds:
        names = " and ".join(str(k) for k in kinds)
        advice = (f"ranks made no progress: see the {names} finding{'s' if len(kinds) > 1 else ''} for when, "
                  "which rank and where")
        if waited_for_work:
            advice += ", and the note on the long gaps that were work"
    elif waited_for_work:
        advice = ("ranks waited for a peer's unmarked work between steps (see the note on the long gaps that "
                  "were work): mark it with traceml.outside_step, or run it on every rank")
    else:
        advice = "ranks made no progress: the ranks' rank-R.hang.json records say where they stopped"
    return replace(account, findings=tuple(replace(f, advice=advice) if f.category == STALLED else f
                                           for f in account.findings))


def with_recurrence(step: StepDiagnosis, found: StragglerRecurrence | None,
                    rank_worst: Callable[[int], Sequence[WorstStep]] = lambda rank: ()) -> StepDiagnosis:
    """``step`` with the straggler findings saying whether the culprit is chronic, rotating or transient;
    or, where no window has a straggler once its spike steps are left out, that the gap is made of a
    few slow steps of the culprit (``rank_worst(rank)``: that rank's slowest steps)."""
    if found is None:
        return step
    if found.pattern == NONE:
        return replace(step, primary=_spike_made(step.primary, found, rank_worst),
                       issues=tuple(_spike_made(f, found, rank_worst) for f in step.issues))

    def add(finding: Finding) -> Finding:
        if not str(finding.kind).endswith("STRAGGLER"):
            return finding
        return replace(
            finding, why=f"{finding.why} Over the run: {found.text}.", next=f"{finding.next} {found.advice}",
            evidence=(*finding.evidence, Evidence("recurrence", found.pattern),
                      Evidence("windows", found.windows), Evidence("window_steps", found.window_steps),
                      Evidence("culprit_windows", str([list(c) for c in found.counts[:8]]))),
        )

    return replace(step, primary=add(step.primary), issues=tuple(add(f) for f in step.issues))


def _spike_made(finding: Finding, found: StragglerRecurrence,
                rank_worst: Callable[[int], Sequence[WorstStep]]) -> Finding:
    """A whole-run straggler that no window has without its spike steps: one rank's few slow steps (a
    checkpoint or an evaluation on rank 0 inside the step, every N steps) that the others wait for.
    Said as such, with the culprit's slowest steps, so it is never read as a rank slower at every step."""
    culprit = culprit_of(finding)
    if culprit is None:
        return finding
    own = list(rank_worst(culprit))
    longest = max((w.step_time for w in own), default=0.0)
    own = sorted((w for w in own if w.step_time >= longest / 2), key=lambda w: w.step)  # the spikes alike
    steps = ", ".join(f"{w.step} ({w.step_time * 1e3:.0f} ms)" for w in own)
    apart = sorted({b.step - a.step for a, b in pairwise(own)})
    spacing = f", {apart[0]} steps apart" if len(apart) == 1 else ""
    named = f": rank {culprit}'s slowest steps are {steps}{spacing}" if own else ""
    return replace(
        finding,
        why=(f"{finding.why} Over the run: no window of {found.window_steps} steps has a straggler once its "
             f"few slowest steps are left out, so the gap is in a few steps, not in every step{named}."),
        next=(f"{finding.next} Rank {culprit} does extra work in a few steps (a checkpoint, an evaluation or "
              "logging on one rank, inside the step) and the others wait for it at the next collective: "
              "move that work out of the step (traceml.outside_step), make it asynchronous, or share it "
              "among the ranks."),
        evidence=(*finding.evidence, Evidence("recurrence", NONE), Evidence("windows", found.windows),
                  Evidence("window_steps", found.window_steps),
                  Evidence("spike_steps", str([w.step for w in own]))),
    )


def with_segment(drift: DriftAnalysis, segments: SegmentAnalysis | None) -> DriftAnalysis:
    """``drift`` told by segment: the last segment (after warm-up) whose level differs from the reference."""
    if segments is None or len(segments.segments) < 2:
        return drift
    ref = segments.segments[segments.reference]
    changed = [s for s in segments.segments if s is not ref and s.label not in (STEADY, WARM_UP)]
    if not changed:
        return drift
    last = changed[-1]
    kind = drift.kind
    ends_the_run = last.last_step == segments.segments[-1].last_step
    speed_changed = last.label in (SLOW, FAST)  # a phase-mix change is no change of speed
    if kind in (DriftKind.STABLE, DriftKind.NOT_ENOUGH_STEPS) and ends_the_run and speed_changed:
        kind = _segment_direction(last.typical_s, last.change, drift.baseline_s) or kind
    return replace(drift, kind=kind, since_step=last.first_step if kind != drift.kind else drift.since_step,
                   segment_steps=(last.first_step, last.last_step), segment_start_unix=last.start_unix,
                   segment_change=last.change, segment_typical_s=last.typical_s,
                   reference_steps=(ref.first_step, ref.last_step), from_segment=kind != drift.kind)


def _segment_direction(typical_s: float, change: float, baseline_s: float | None) -> DriftKind | None:
    """Which way a slow or fast period that ends the run moved the run's speed, or ``None`` (no drift).

    Drift is the recent steps against the early ones, so where the bands measured an early level the
    period is judged against it, by the size a segment needs to differ (``SEGMENT_CHANGE``, 25 %): the
    reference segment holds most of the training time, and that may be a slow patch in the middle (ten
    200 ms steps among 370 of 4 ms), against which the run's ordinary end reads "fast" and a slower end
    read "speeding up". Only without an early level (too few steps for the bands) is the period's
    change against the reference used."""
    if baseline_s is None or baseline_s <= 0:
        return DriftKind.SLOWING if change > 0 else DriftKind.SPEEDING_UP
    against_early = typical_s / baseline_s - 1.0
    if pace_apart(typical_s, baseline_s) < 1.0:
        return None
    return DriftKind.SLOWING if against_early > 0 else DriftKind.SPEEDING_UP
