"""Split each rank's exposed collective time into *waiting* for the last rank and *transfer*.

In a collective no rank can finish before the last one has arrived. For one step and one of its
collective waits ``i`` (``traceml.communication.entries``: a blocking call's start, DDP's last
gradient bucket hand-over of a backward call), rank ``r`` entered at ``a[r][i]`` after working
``w[r][i]`` since it left its previous collective, of this step or an earlier one
(``traceml.communication.work``). The last rank
``k`` arrived at ``a[k][i]``. Rank ``r`` waited for it

    min(a[k][i] - a[r][i], w[k][i] - w[r][i])   (when positive)

that is, as far as ``k`` arrived late because it *worked* longer. A rank that arrives late only
because it left the previous collective late (one rank always returns from a call a little after
the other) shows a collective's own cost, which counts as transfer. Per rank and step:

    waiting[r]  = min(exposed[r], sum over i of the above), attributed to the late ranks
    transfer[r] = exposed[r] - waiting[r]

**Clock.** Entry times are on the spans' clock: each rank's ``perf_counter`` plus an anchor read
once at ``init()`` (``time_ns() - perf_counter_ns()``, the tightest of a few bracketed reads, so a
preemption cannot skew it: ``capture/clock_anchor.py``). On one host every rank reads the same kernel
clocks, so ranks agree to within the anchor's read (about a microsecond) unless the wall clock was
stepped between two ranks' ``init()``. Across hosts the entries differ by the hosts' clock offset:
NTP keeps it to about 0.1-10 ms, PTP to microseconds. A waiting time smaller than that offset is not
attributable; each term is clipped to the rank's exposed time, so an offset moves time between
waiting and transfer but never creates either.

Where a step's entries are missing on some rank, or the ranks' counts differ, that step falls back
to a clock-free estimate: every rank leaves a collective at about the same moment, so the rank that
waited least waited for nobody; its exposed time is the transfer, and each rank's excess over it is
waiting, attributed to that rank. Per step, not averaged over the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from traceml_otel.analyze.findings import RankMetrics
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import StepTiming

ENTRY_BASIS = "entry times"
CLOCK_FREE_BASIS = "least-waiting rank"


@dataclass(frozen=True, slots=True)
class RankSplit:
    """One rank's exposed collective time per step (mean over the window), split in two."""

    rank: int
    waiting: float
    """Mean per step: waiting in collectives for a later rank to arrive."""
    transfer: float
    """Mean per step: the rest of the exposed time (the collective itself, after all arrived)."""
    waited_for: tuple[tuple[int, float], ...]
    """(rank, mean waiting per step for it), largest first, at most three ranks."""
    entry_steps: int
    """Steps split from entry times; the others used the clock-free estimate."""


def split_communication(
    ranks: Sequence[int], per_rank: Sequence[Sequence[StepTiming]], clock: Clock
) -> dict[int, RankSplit]:
    """Each rank's split over aligned steps; empty unless 2+ ranks measured exposed time on every step."""
    if len(ranks) < 2 or not per_rank or not per_rank[0]:
        return {}
    n_ranks, n_steps = len(ranks), len(per_rank[0])
    waiting = [0.0] * n_ranks
    transfer = [0.0] * n_ranks
    culprits: list[dict[int, float]] = [{} for _ in ranks]
    entry_steps = 0
    for j in range(n_steps):
        steps = [per_rank[i][j] for i in range(n_ranks)]
        exposed = [s.communication(clock) for s in steps]
        if any(e is None for e in exposed):
            return {}
        by_entries = _entry_waits(steps, exposed)  # type: ignore[arg-type]
        if by_entries is not None:
            entry_steps += 1
            waits = by_entries
        else:
            waits = _clock_free_waits(exposed)  # type: ignore[arg-type]
        for i, (wait, blamed) in enumerate(waits):
            waiting[i] += wait
            transfer[i] += exposed[i] - wait  # type: ignore[operator]
            for culprit, seconds in blamed.items():
                culprits[i][ranks[culprit]] = culprits[i].get(ranks[culprit], 0.0) + seconds
    return {
        rank: RankSplit(
            rank=rank,
            waiting=waiting[i] / n_steps,
            transfer=transfer[i] / n_steps,
            waited_for=tuple(
                (other, total / n_steps)
                for other, total in sorted(culprits[i].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            ),
            entry_steps=entry_steps,
        )
        for i, rank in enumerate(ranks)
    }


Waits = list[tuple[float, dict[int, float]]]
"""Per rank (by index): its waiting in the step and how much of it each later rank (index) caused."""


def _entry_waits(steps: Sequence[StepTiming], exposed: Sequence[float]) -> Waits | None:
    entries = [s.comm_entries for s in steps]
    work = [s.comm_work for s in steps]
    lengths = {len(e) for e in entries if e is not None} | {len(w) for w in work if w is not None}
    if any(e is None for e in entries) or any(w is None for w in work) or len(lengths) != 1:
        return None
    waits: Waits = [(0.0, {}) for _ in steps]
    for calls, worked in zip(zip(*entries, strict=True), zip(*work, strict=True), strict=True):
        last = max(range(len(calls)), key=lambda i: (calls[i], -i))
        for i, entered in enumerate(calls):
            # Waited for the last rank, as far as that rank worked longer since its previous collective;
            # arriving late only because it left the previous collective late is the collective's cost.
            waited = min(calls[last] - entered, worked[last] - worked[i])
            if i != last and waited > 0:
                blamed = waits[i][1]
                blamed[last] = blamed.get(last, 0.0) + waited * 1e-9
    result: Waits = []
    for i, (_, blamed) in enumerate(waits):
        total = sum(blamed.values())
        scale = min(1.0, exposed[i] / total) if total > 0 else 0.0
        result.append((total * scale, {k: v * scale for k, v in blamed.items()}))
    return result


def _clock_free_waits(exposed: Sequence[float]) -> Waits:
    least = min(range(len(exposed)), key=lambda i: (exposed[i], i))
    floor = exposed[least]
    return [
        (e - floor, {least: e - floor} if i != least and e > floor else {}) for i, e in enumerate(exposed)
    ]


def with_split(
    ranks: tuple[RankMetrics, ...], split: dict[int, RankSplit], steps: int
) -> tuple[RankMetrics, ...]:
    """The ranks' metrics with their split filled in (unchanged where there is none)."""
    if not split:
        return ranks
    return tuple(
        replace(
            m,
            communication_waiting=split[m.rank].waiting,
            communication_transfer=split[m.rank].transfer,
            waited_for=split[m.rank].waited_for,
            split_basis=ENTRY_BASIS if split[m.rank].entry_steps == steps else CLOCK_FREE_BASIS,
        )
        if m.rank in split and m.communication is not None else m
        for m in ranks
    )
