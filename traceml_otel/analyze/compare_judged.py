"""The time verdict of ``compare``: which interval decides, and what to say about the machine's load.

The wall time per unit of work decides. When both sides recorded CPU samples (``rank-R.cpu.json``),
its on-CPU interval is shown beside it, and:

- when the wall and on-CPU verdicts differ and the change in CPU wait explains the difference (the
  predicted wall change lies in the wall interval, or the growth in time waited accounts for at least
  half the wall change), the machine's load made the wall change: said, and the on-CPU interval
  decides;
- when the wall interval is too wide to judge (a loaded machine) but the on-CPU interval clears the
  threshold in the direction the wall time points, the code's work changed: the on-CPU interval
  decides;
- when the on-CPU time moved with the wall time, the code changed. A wall change that waiting for a
  CPU does not explain (more sleep, I/O or device time) stays the code's;
- except when the slower side ran beside other work (a share of the machine's CPUs at least
  :data:`OTHER_WORK_GAP` more than the faster side's, outside the training processes) and waited for a
  CPU at least :data:`WAIT_GAP` more of its time: a contended machine inflates on-CPU time too (parallel
  runtimes spin while their peer threads wait for a CPU: torch's intra-op threads made a hog's A/A
  pair +3,759 % on-CPU), so neither interval can tell the code from the load: inconclusive, said.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.compare_interval import LOADED_CV_PER_WAIT, RUN_TO_RUN_CV, Interval
from traceml_otel.analyze.compare_noise import FAST_QUANTILE, MIN_BLOCKS
from traceml_otel.analyze.compare_sides import (
    fast_interval,
    intervals,
    other_work_share,
    side_runs,
    wait_share,
)

if TYPE_CHECKING:
    from traceml_otel.analyze.compare_summary import RunSummary


@dataclass(frozen=True, slots=True)
class Change:
    """One compared quantity: before, after, relative change and what it means."""

    name: str
    before: float | None
    after: float | None
    change: float | None
    verdict: str
    material: bool = False


def signed(change: float) -> str:
    return f"{change * 100:+.1f} %"


def interval_text(interval: Interval) -> str:
    """``+3.1 % (±6.0 %)``."""
    return f"{signed(interval.change)} (±{interval.half_width * 100:.1f} %)"


OTHER_WORK_GAP = 0.25
"""The slower side's other work (CPUs busy outside its training processes, a share of the machine) at
least this much above the faster side's is a different machine load, not the code's change alone."""
WAIT_GAP = 0.10
"""... together with waiting for a CPU at least this much more of its wall time."""
LOAD_NOT_JUDGED = "not judged: the machine's load differed between the sides"
"""Added to the deciding interval's method when :func:`_confounded` holds (it is then
``load_confounded``, and the phases are not judged either)."""

CONTENTION_EXPLAINS = 0.5
"""A wall change counts as the machine's when the change in time waited for a CPU per unit of work is
at least this share of it (and the on-CPU time did not move the same way)."""


def judged_time(
    a: RunSummary, b: RunSummary, basis: str, point: Change
) -> tuple[Change, Interval | None, Interval | None, Interval | None, list[str]]:
    """(the time change with its verdict, the deciding interval, the wall interval, the on-CPU interval
    when both sides recorded CPU samples, notes)."""
    wall, cpu = intervals(a, b, basis)
    unit = "step" if basis == "step" else basis
    notes: list[str] = []
    if wall is None:
        notes.append("no estimate of the runs' own noise (fewer than 12 steady steps, or a report without "
                     "a 'noise' section): the point change is judged alone against +-3 %")
        return point, None, None, None, notes
    n_a, n_b = len(side_runs(a)), len(side_runs(b))
    if wall.between_runs:
        notes.append(f"interval from {n_a} + {n_b} runs: the spread between runs is measured")
    else:
        notes.append(f"only within-run noise was available (one run per side): the interval adds "
                     f"{RUN_TO_RUN_CV * 100:g} % per run, plus {LOADED_CV_PER_WAIT * 100:g} % x the share of "
                     "time it waited for a CPU, or the spread of its own block means when larger, for the "
                     "run-to-run variation one run cannot show; give several runs per side "
                     "(A1 A2 A3 --against B1 B2 B3) to measure it")
    decider = wall
    confounded = _confounded(a, b, wall, cpu)
    if confounded is not None:
        notes.append(confounded)
        change = Change(point.name, wall.before, wall.after, wall.change, "inconclusive")
        decider = replace(wall, verdict="inconclusive", method=f"{wall.method}; {LOAD_NOT_JUDGED}",
                          load_confounded=True)
        return change, decider, wall, cpu, notes
    if cpu is None:
        notes.append("CPU wait not measured on both sides (rank-R.cpu.json missing, or fewer than "
                     f"{MIN_BLOCKS} of its 0.1 s windows within the compared steps: a run that short): "
                     "a busier machine cannot be told from slower code")
    else:
        use_cpu, text = _contention(a, b, wall, cpu, unit)
        notes.append(text)
        if use_cpu:
            decider = cpu
    fast = fast_interval(a, b, basis) if decider.verdict == "inconclusive" else None
    if fast is not None and fast.verdict in ("regression", "improvement") and (fast.change > 0) == (
            decider.change > 0):
        notes.append(f"the mean time per {unit} {interval_text(decider)} is too noisy between runs to "
                     f"judge; the fast steps' time (the {FAST_QUANTILE:.0%} quantile of each block's steps, "
                     f"which the machine's interference cannot lower) moved {interval_text(fast)}: the "
                     "code's work changed")
        decider = fast
    change = Change(point.name, decider.before, decider.after, decider.change, decider.verdict,
                    decider.verdict in ("regression", "improvement")
                    and abs(decider.change) >= t.COMPARE_TIME_MATERIAL)
    return change, decider, wall, cpu, notes


def _confounded(a: RunSummary, b: RunSummary, wall: Interval, cpu: Interval | None) -> str | None:
    """Why the change cannot be told from the machine's load (``None`` when it can): the slower side
    ran beside other work and waited for a CPU, and its on-CPU time moved with its wall time."""
    if cpu is None or wall.verdict not in ("regression", "improvement") or cpu.verdict != wall.verdict:
        return None
    slower, faster = (b, a) if wall.change > 0 else (a, b)
    others, others_faster = other_work_share(slower), other_work_share(faster)
    waited, waited_faster = wait_share(slower), wait_share(faster)
    if others is None or others_faster is None or waited is None or waited_faster is None:
        return None
    if others - others_faster < OTHER_WORK_GAP or waited - waited_faster < WAIT_GAP:
        return None
    which = "second" if slower is b else "first"
    return (f"the {which} run shared the machine with other work ({others * 100:.0f} % of its CPUs busy "
            f"outside the training processes, against {others_faster * 100:.0f} %) and waited for a CPU "
            f"{waited * 100:.0f} % of its wall time (against {waited_faster * 100:.0f} %): a contended "
            "machine slows on-CPU time too (parallel runtimes spin while their threads wait for a CPU), so "
            f"the wall change {interval_text(wall)} and the on-CPU change {interval_text(cpu)} cannot be "
            "told from the load: not judged; compare runs on equally quiet machines")


def _contention(a: RunSummary, b: RunSummary, wall: Interval, cpu: Interval, unit: str) -> tuple[bool, str]:
    """(whether the on-CPU interval decides, what to say).

    The on-CPU interval decides when the wall time and the on-CPU time disagree and the change in CPU
    wait explains the difference: the wall change the on-CPU change and the waiting predict,
    ``(1 + cpu change) * (1 - wait A) / (1 - wait B) - 1``, lies inside the wall interval, or the
    growth in time waited per unit of work is at least half the wall change. It also decides when the
    wall interval is too wide to judge and the on-CPU time clearly moved the way the wall time points."""
    wait_a, wait_b = wait_share(a), wait_share(b)
    shares = "" if wait_a is None or wait_b is None else (
        f" (B waited for a CPU {wait_b * 100:.0f} % of its wall time, A {wait_a * 100:.0f} %)")
    moved = wall.verdict in ("regression", "improvement")
    cpu_moved = cpu.verdict in ("regression", "improvement")
    if (moved or cpu_moved) and cpu.verdict != wall.verdict and wait_a is not None and wait_b is not None:
        stretch = (1 - wait_a) / max(1e-6, 1 - wait_b)  # B's wall per unit of own time, against A's
        predicted = (1 + cpu.change) * stretch - 1
        waited = wall.after * wait_b - wall.before * wait_a  # per unit of work
        grown = wall.after - wall.before
        if wall.low <= predicted <= wall.high or (grown != 0 and waited / grown >= CONTENTION_EXPLAINS):
            who = "second" if stretch > 1 else "first"
            longer = abs(stretch if stretch > 1 else 1 / stretch) * 100 - 100
            own = "is unchanged" if not cpu_moved else "changed"
            return True, (f"the {who} run waited {longer:.0f} % longer for a CPU{shares}; its own work "
                          f"per {unit} {own} (on-CPU {interval_text(cpu)}): the machine's load, not the "
                          f"code, made the wall change {interval_text(wall)}, which is not judged")
    if wall.verdict == "inconclusive" and cpu_moved and (wall.change > 0) == (cpu.change > 0):
        return True, (f"on-CPU time per {unit} moved {interval_text(cpu)} while the wall time "
                      f"{interval_text(wall)} is too noisy to judge: the code's work changed{shares}")
    if moved and cpu.verdict == wall.verdict:
        return False, (f"on-CPU time per {unit} moved with the wall time ({interval_text(cpu)}): the code's "
                       f"work changed, not the machine's load{shares}")
    return False, f"on-CPU time per {unit} {interval_text(cpu)}{shares}"
