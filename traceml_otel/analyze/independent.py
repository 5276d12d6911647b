"""Ranks that train independently (``traceml.parallelism = independent``): compared, never stragglers.

Without a DDP/FSDP gradient sync no rank waits for another, so the straggler rule's reading of
backward as "time waiting in the collectives" does not apply. The ranks can still be compared:
the slowest rank's mean step time against the median, with the component that differs most.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Evidence, Finding, RankMetrics
from traceml_otel.analyze.kinds import Severity, StepKind

_COMPONENTS = (
    ("input_wait", "waiting for input"),
    ("forward", "in forward"),
    ("backward", "in backward"),
    ("optimizer", "in the optimizer"),
    ("h2d", "copying to the device"),
    ("residual", "outside the phases"),
)


def independent_ranks_rule(ranks: Sequence[RankMetrics]) -> Finding | None:
    """INDEPENDENT_RANKS (info) when the slowest rank's step time is >= 10 % above the median."""
    measured = [m for m in ranks if m.step_time]
    if len(measured) < 2:
        return None
    median = statistics.median(m.step_time for m in measured)
    slowest = max(measured, key=lambda m: (m.step_time, -m.rank))
    assert slowest.step_time is not None
    excess = (slowest.step_time - median) / median if median > 0 else 0.0
    if excess < t.STRAGGLER_WARN:
        return None
    part, words, extra = _largest_excess(slowest, measured)
    why = (
        f"These {len(ranks)} processes do not synchronize gradients (no DDP or FSDP wrapper, or no process "
        f"group), so no rank waits for another. Rank {slowest.rank}'s step takes "
        f"{slowest.step_time * 1e3:.1f} ms, {excess:.0%} above the median of {median * 1e3:.1f} ms"
    )
    why += f"; most of the difference is {words} (+{extra * 1e3:.1f} ms)." if part else "."
    return Finding(
        kind=StepKind.INDEPENDENT_RANKS,
        severity=Severity.INFO,
        score=excess,
        title=f"Rank {slowest.rank} is slower (independent processes)",
        why=why,
        next=(
            "If the processes were meant to train one model together, wrap it in DistributedDataParallel "
            "or let Accelerate distribute it (on a CPU-only machine: ACCELERATE_USE_CPU=1 or "
            f"Accelerator(cpu=True)). If they are separate runs, look at rank {slowest.rank}'s host and data."
        ),
        evidence=(
            Evidence("slowest_rank", slowest.rank, "rank"),
            Evidence("step_time_excess", excess, "ratio"),
            Evidence("median_step_time", median, "s"),
        ),
    )


def _largest_excess(slowest: RankMetrics, ranks: Sequence[RankMetrics]) -> tuple[str, str, float]:
    best = ("", "", 0.0)
    for name, words in _COMPONENTS:
        values = [getattr(m, name) for m in ranks]
        mine = getattr(slowest, name)
        if mine is None or any(v is None for v in values):
            continue
        extra = mine - statistics.median(values)
        if extra > best[2]:
            best = (name, words, extra)
    return best
