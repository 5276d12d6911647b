"""Long gaps between steps that were work, not stalls: the training thread was busy through them.

A stall candidate (:mod:`~traceml_otel.analyze.stalls`) is a step whose span ran far past the rank's
typical one. When the excess lies between steps (the unnamed time before the step, not its input wait
or block) and the rank's CPU samples (``rank-R.cpu.json``, the emitter's reading of the training
thread's on-CPU time and run-queue wait every 0.1 s, :mod:`~traceml_otel.emit.trainer_cpu`) show the
thread on a CPU or runnable for one (a loaded machine) for at least :data:`BUSY_SHARE` of that gap, the
program was busy with work of its own between steps: an evaluation, a checkpoint or a metrics pass
that no ``outside_step`` names. That is time between steps (the time account's ``between_steps``),
said with its steps, never a ``STALL`` that "made no progress".
A thread that sleeps, blocks on I/O or waits in a collective is off the CPU, so a real stall stays one;
so does any gap a hang watchdog declared, and any gap the samples do not cover (fewer than
:data:`MIN_WINDOWS` sampler windows, or no samples at all).

The samples carry how many steps had ended by their time, so the gap after a rank's ``n``-th step is
the run of consecutive samples whose count is ``n``: no clock has to be matched between processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from traceml_otel.wire.cpu_record import CpuRecord

BUSY_SHARE = 0.5
"""Share of a gap's wall time the training thread was on a CPU or runnable for one, from which the gap
is the program's own work."""
MIN_WINDOWS = 3
"""Sampler windows (0.1 s each, more after thinning) a gap needs for its share to be judged."""
MAX_LISTED = 5
"""Gaps named in the report's note (the longest); all of them count."""


@dataclass(frozen=True, slots=True)
class BusyGap:
    """A long gap before ``step`` on ``rank`` in which its training thread worked."""

    rank: int
    step: int
    start: float
    """Unix seconds."""
    seconds: float
    busy_share: float
    """The share of the gap its training thread was on a CPU or runnable for one."""


class GapCpu:
    """The training threads' busy share of wall time (on a CPU, or runnable and waiting for one: a loaded
    machine does not turn work into a stall) while exactly ``n`` steps had ended, per rank."""

    def __init__(self, records: Sequence[CpuRecord]) -> None:
        self._by_rank: dict[int, dict[int, tuple[int, int, int]]] = {}
        for record in records:
            per_count: dict[int, tuple[int, int, int]] = {}
            for before, after in pairwise(record.samples):
                if before[0] != after[0] or after[1] <= before[1]:
                    continue  # a step ended inside the window: not all of it is the gap
                busy, wall, windows = per_count.get(after[0], (0, 0, 0))
                wanted = after[2] - before[2] + max(0, after[3] - before[3])  # on a CPU, or runnable for one
                per_count[after[0]] = (busy + wanted, wall + after[1] - before[1], windows + 1)
            self._by_rank[record.rank] = per_count

    def share(self, rank: int, ended: int) -> float | None:
        """Busy share while ``ended`` steps of ``rank`` had ended (``None``: too few windows)."""
        found = self._by_rank.get(rank, {}).get(ended)
        if found is None or found[2] < MIN_WINDOWS or found[1] <= 0:
            return None
        return min(1.0, found[0] / found[1])


WAITS_SAID = ", and the other ranks' waits for it as stalled"


def busy_gaps_note(gaps: Sequence[BusyGap], left_out: int = 0, waited: bool = False) -> str:
    """One line for the report: where the program worked between steps, and what to do about it."""
    listed = sorted(gaps, key=lambda g: -g.seconds)[:MAX_LISTED]
    listed.sort(key=lambda g: g.start)
    where = ", ".join(f"rank {g.rank} before step {g.step} {g.seconds:.1f} s" for g in listed)
    total = len(gaps) + left_out
    more = f" (the longest {len(listed)} of {total})" if total > len(listed) else ""
    low, high = (round(f(g.busy_share for g in gaps) * 100) for f in (min, max))
    shares = f"{low} %" if low == high else f"{low}-{high} %"
    return (f"{total} long gap(s) between steps were work, not stalls: the training thread was busy (on or "
            f"waiting for a CPU) for "
            f"{shares} of each{more}: {where}. Unmarked work between steps (an evaluation, a checkpoint?): "
            f"counted as between steps{WAITS_SAID if waited else ''}; "
            "name it with traceml.outside_step(\"evaluation\")")
