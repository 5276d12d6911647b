"""Compare two runs (or two sides of runs): is B a regression, an improvement, or equivalent to A?

Policy (TraceML's thresholds, judged with each side's noise): the change in time per unit of work
gets a 95 % interval (:mod:`traceml_otel.analyze.compare_interval`); it is a regression or an
improvement only when the whole interval clears 3 % (8 % or more is material), equivalent when the
interval lies inside +-3 %, else inconclusive. When both sides recorded the training thread's CPU
wait, the time per unit of work less that wait decides (the machine's contention is not the code's
change) and the wall-time interval is shown beside it. Without a noise estimate (too few steady
steps, an older report) the point change is judged alone, said in a note. Peak memory counts at
+-10 %; a worse primary diagnosis is a regression. The unit of work is a token when both runs
recorded tokens, else a sample when both recorded samples, else a step (step time is only comparable
at equal work per step, which is then said plainly). Phases are compared only when both runs were
analysed on the same clock (point changes: information). A side without usable step data, or with
bad data (NaN), makes the verdict INCONCLUSIVE and ``usable`` False; otherwise any regression makes
it REGRESSION, any improvement IMPROVEMENT, an inconclusive time per unit of work INCONCLUSIVE, else
EQUIVALENT.

The thresholds are in :mod:`traceml_otel.analyze.thresholds` (``COMPARE_*``). A side is a
:class:`~traceml_otel.analyze.compare_summary.RunSummary`: ``summary_of`` takes it from a run's
analysis, and ``traceml_otel.report.run_summary`` reads the same fields from a stored ``report.json``,
so comparing a fresh run with last week's report works the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.compare_interval import Interval, judge
from traceml_otel.analyze.compare_judged import Change, judged_time
from traceml_otel.analyze.compare_summary import PHASES, RunSummary
from traceml_otel.analyze.kinds import HEALTHY_KINDS, INCONCLUSIVE_KINDS, SEVERITY_ORDER, Severity


@dataclass(frozen=True, slots=True)
class Comparison:
    """The verdict and every change behind it."""

    a: RunSummary
    b: RunSummary
    verdict: str
    material: bool
    step_time: Change
    memory: Change
    diagnosis: str
    phases: tuple[Change, ...]
    notes: tuple[str, ...]
    basis: str = "step"
    """The unit of work the verdict compares time per: ``token``, ``sample`` or ``step``."""
    work: Change | None = None
    """Time per token or per sample, when that is the basis."""
    interval: Interval | None = None
    """The interval that decided the time verdict (wall time; on-CPU time when the machine's load
    explains the wall change)."""
    cpu: Interval | None = None
    """The on-CPU interval, when both sides recorded CPU samples."""
    wall: Interval | None = None
    """The wall-time interval (the deciding one unless the on-CPU interval decided)."""
    usable: bool = True
    """False when a side had no usable or bad data (``--fail-on-regression`` then fails)."""


def _relative(before: float | None, after: float | None) -> float | None:
    """``after / before - 1``, rounded to 1e-9 so a change of exactly 3 % is not 2.9999999 %."""
    if before is None or after is None or before <= 0:
        return None
    return round(after / before - 1.0, 9)


def _change(
    name: str, before: float | None, after: float | None, threshold: float, material: float
) -> Change:
    delta = _relative(before, after)
    if delta is None:
        return Change(name, before, after, None, "not compared")
    if delta >= threshold:
        verdict = "regression"
    elif delta <= -threshold:
        verdict = "improvement"
    else:
        verdict = "equivalent"
    return Change(name, before, after, delta, verdict, verdict != "equivalent" and abs(delta) >= material)


def _within_noise(phase: Change, half_width: float) -> Change:
    """A phase's change judged with the noise of the time that decides (its 95 % interval's half width,
    a floor: a phase is a part of the step and no steadier than the whole): a 5 % change inside a
    +-10 % noise is no regression or improvement, nor equivalence within 3 %, but inconclusive."""
    if phase.change is None or phase.verdict == "not compared":
        return phase
    verdict = judge(phase.change - half_width, phase.change + half_width)
    return replace(phase, verdict=verdict, material=verdict in ("regression", "improvement")
                   and abs(phase.change) >= t.COMPARE_TIME_MATERIAL)


def _badness(summary: RunSummary) -> int | None:
    """0 healthy, 1 a warning-level problem, 2 critical; ``None`` when the data could not decide.

    A problem kind counts at least as a warning, whatever severity it carries (an ``info`` one too)."""
    if summary.kind in INCONCLUSIVE_KINDS:
        return None
    if summary.kind in HEALTHY_KINDS:
        return 0
    warning = SEVERITY_ORDER[Severity.WARNING]
    try:
        return max(warning, SEVERITY_ORDER[Severity(summary.severity)])
    except ValueError:  # a severity this version does not know (a newer report's)
        return warning


def _diagnosis(a: RunSummary, b: RunSummary) -> str:
    worse_a, worse_b = _badness(a), _badness(b)
    if worse_a is None or worse_b is None:
        return "not compared"
    if worse_b > worse_a:
        return "regression"
    if worse_b < worse_a:
        return "improvement"
    return "equivalent" if a.kind == b.kind else "changed"


def _work_basis(a: RunSummary, b: RunSummary) -> tuple[str, Change | None, list[str]]:
    """Which unit of work to compare time per, the change in it, and what to say about the work."""
    notes: list[str] = []
    if a.time_per_token is not None and b.time_per_token is not None:
        change = _change("time_per_token", a.time_per_token, b.time_per_token, t.COMPARE_TIME_CHANGE,
                         t.COMPARE_TIME_MATERIAL)
        return "token", change, notes
    if a.time_per_sample is not None and b.time_per_sample is not None:
        change = _change("time_per_sample", a.time_per_sample, b.time_per_sample,
                         t.COMPARE_TIME_CHANGE, t.COMPARE_TIME_MATERIAL)
        return "sample", change, notes
    known = [s.label for s in (a, b) if s.samples_per_step is not None]
    if len(known) == 1:
        notes.append(f"samples per step recorded for {known[0]} only: step time compared as if both runs did "
                     "the same work per step")
    elif not known:
        notes.append("work per step not recorded on either run: step time compared as if both did the same "
                     "work per step (trace_step(model, samples=N), or a DataLoader, records it)")
    return "step", None, notes


def _differs(before: float | None, after: float | None) -> bool:
    if before is None or after is None or before <= 0:
        return False
    return abs(after / before - 1) > t.COMPARE_WORK_DIFFERS


def compare_runs(a: RunSummary, b: RunSummary) -> Comparison:
    """Apply the comparison policy to two run summaries (A = before, B = after)."""
    notes: list[str] = [f"{s.label}: {s.problem}" for s in (a, b) if s.problem]
    step = _change("step_time", a.step_time, b.step_time, t.COMPARE_TIME_CHANGE, t.COMPARE_TIME_MATERIAL)
    basis, work, work_notes = _work_basis(a, b)
    notes += work_notes
    if basis != "step" and work is not None:
        per = "tokens" if basis == "token" else "samples"
        before = a.tokens_per_step if basis == "token" else a.samples_per_step
        after = b.tokens_per_step if basis == "token" else b.samples_per_step
        if _differs(before, after):
            notes.append(f"work per step differs ({before:g} -> {after:g} {per} per step): step time is "
                         f"shown but not judged; time per {basis} decides")
            step = Change(step.name, step.before, step.after, step.change, "not compared")
        else:
            step = Change(step.name, step.before, step.after, step.change, "not compared")
            notes.append(f"same work per step ({before:g} {per}); time per {basis} decides")
    primary = work if work is not None else step
    memory = _change(
        "peak_memory", _float(a.peak_memory), _float(b.peak_memory), t.COMPARE_MEMORY_CHANGE,
        t.COMPARE_MEMORY_CHANGE,
    )
    diagnosis = _diagnosis(a, b)
    if basis != "step" and _differs(a.samples_per_step, b.samples_per_step) and diagnosis in (
            "regression", "improvement"):
        notes.append(f"diagnosis {diagnosis} not judged: the shares of a step change with its work per step")
        diagnosis = "not compared"
    same_clock = a.clock == b.clock
    phases: tuple[Change, ...] = ()
    if same_clock:
        phases = tuple(
            _change(name, a.phase(name), b.phase(name), t.COMPARE_TIME_CHANGE, t.COMPARE_TIME_MATERIAL)
            for name in PHASES
        )
        if basis != "step" and _differs(a.samples_per_step, b.samples_per_step):
            phases = tuple(Change(p.name, p.before, p.after, p.change, "not compared") for p in phases)
    else:
        notes.append(
            f"different clocks ({a.clock} vs {b.clock}): phases not compared, step times on their own clocks"
        )
    if same_clock and (a.phase("communication") is None) != (b.phase("communication") is None):
        notes.append(
            "collective waits were measured in only one run: there forward, backward and optimizer exclude "
            "them, in the other they include them"
        )
    if memory.verdict == "not compared":
        sides = [s.label for s in (a, b) if s.peak_memory is None]
        where = "either side" if len(sides) == 2 else sides[0] if sides else "one side"
        notes.append(f"peak memory not compared (no GPU memory data on {where})")
    if diagnosis == "not compared":
        notes.append("diagnosis not compared (one run has insufficient step-time data)")
    if not a.usable or not b.usable:
        empty = ", ".join(s.label for s in (a, b) if not s.usable)
        notes.insert(0, f"no usable step data in {empty}: nothing can be concluded")
        return Comparison(a, b, "INCONCLUSIVE", False, step, memory, diagnosis, phases, tuple(notes),
                          basis, work, usable=False)
    primary, interval, wall, cpu, time_notes = judged_time(a, b, basis, primary)
    if interval is not None and interval.load_confounded:  # the phases' times cannot be judged either
        phases = tuple(replace(p, verdict="inconclusive", material=False)
                       if p.verdict in ("regression", "improvement") else p for p in phases)
    elif interval is not None:
        phases = tuple(_within_noise(p, interval.half_width) for p in phases)
    if basis == "step":
        step = primary
    else:
        work = primary
    notes = [*time_notes, *notes]
    verdicts = {primary.verdict, memory.verdict, diagnosis}
    if "regression" in verdicts:
        verdict = "REGRESSION"
    elif "improvement" in verdicts:
        verdict = "IMPROVEMENT"
    elif "inconclusive" in verdicts:
        verdict = "INCONCLUSIVE"
    else:
        verdict = "EQUIVALENT"
    return Comparison(a, b, verdict, primary.material and primary.verdict in ("regression", "improvement"),
                      step, memory, diagnosis, phases, tuple(notes), basis, work, interval, cpu,
                      wall)


def with_label(summary: RunSummary, label: str) -> RunSummary:
    return replace(summary, label=label)


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)
