"""Rules on measured collective time: COMMUNICATION_BOUND, and stragglers named from measured waits.

Both read each rank's *exposed* communication: the part of its collective time the step waited for
(``RankMetrics.communication``). In a collective every rank waits until the last one arrives, so a
rank's exposed time is the transfer itself plus its wait for the slowest rank. The rank that waits
least is the one the others wait for; its exposed time is (close to) the pure transfer cost.

- COMMUNICATION_BOUND looks at that least-waiting rank: a waiting time that a straggler causes is
  not a bandwidth problem, and is left to the straggler rule.
- The sync straggler is the least-waiting rank (the culprit); the victim is the upper-median rank,
  and ``score = (victim wait - culprit wait) / victim step time``, the same scale and thresholds as
  the inferred straggler rule in ``straggler.py``, which stays the fallback where waits were not
  measured on every rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Evidence, Finding, RankMetrics
from traceml_otel.analyze.kinds import Severity, StepKind
from traceml_otel.analyze.straggler import (
    H2D_CAUSE,
    INPUT_CAUSE,
    SHARED_ADVICE,
    straggler_cause,
    straggler_finding,
)


def waits_measured(ranks: Sequence[RankMetrics]) -> bool:
    """Two or more ranks, each with measured exposed collective time and step time."""
    return len(ranks) >= 2 and all(
        m.communication_measured and m.communication is not None and m.step_time for m in ranks
    )


def _share(m: RankMetrics) -> float:
    assert m.communication is not None and m.step_time
    return m.communication / m.step_time


def communication_rule(ranks: Sequence[RankMetrics]) -> Finding | None:
    """COMMUNICATION_BOUND: the least-waiting rank spends >= 10 % of its step in exposed collectives.

    Silent when no rank measured collectives (a single process, timing off) or the exposed part was
    not measured on every rank: it never claims anything about unmeasured communication.
    """
    if not ranks or not all(
        m.communication_measured and m.communication is not None and m.step_time for m in ranks
    ):
        return None
    least = min(ranks, key=lambda m: (_share(m), m.rank))
    score = _share(least)
    if score < t.COMMUNICATION_WARN:
        return None
    median = statistics.median(_share(m) for m in ranks)
    total = least.communication_total
    per_step = least.communication_bytes
    size = f", {per_step / (1 << 20):.1f} MiB per step" if per_step else ""
    overlap = ""
    if total is not None and total > 0 and least.communication is not None:
        overlap = f"; {1 - least.communication / total:.0%} of its collective time overlaps compute"
    return Finding(
        kind=StepKind.COMMUNICATION_BOUND,
        severity=Severity.CRITICAL if score >= t.COMMUNICATION_CRITICAL else Severity.WARNING,
        score=score,
        title="Communication-bound",
        why=(
            f"Even rank {least.rank}, the rank that waits least in collectives, spends {score:.0%} of its "
            f"step waiting for them (exposed collective time {least.communication * 1e3:.1f} ms per step"  # type: ignore[operator]
            f"{size}{overlap}). Median over ranks: {median:.0%}."
        ),
        next=(
            "Send fewer bytes or hide them behind compute: accumulate gradients over more micro-batches "
            "(DDP no_sync) or use a larger batch per rank, compress gradients (a bf16/fp16 communication "
            "hook), tune DDP's bucket_cap_mb so reduction starts earlier, and check the interconnect "
            "(NCCL over the right network, not TCP)."
        ),
        evidence=(
            Evidence("communication_share", score, "ratio"),
            Evidence("communication_rank", least.rank, "rank"),
            Evidence("communication_share_median", median, "ratio"),
            Evidence("exposed_communication", least.communication, "s"),
            Evidence("total_communication", total, "s"),
            Evidence("communication_bytes", per_step, "By"),
        ),
    )


_CAUSES = (
    INPUT_CAUSE,
    H2D_CAUSE,
    (StepKind.COMPUTE_STRAGGLER, "compute", "computing (forward, backward and optimizer, waits excluded)"),
)
_ADVICE = {
    **SHARED_ADVICE,
    StepKind.COMPUTE_STRAGGLER: (
        "Rank {c} computes longer: check for uneven batch sizes or sequence lengths per rank, a slower or "
        "throttled device, or another process sharing it."
    ),
}


def sync_straggler_rule(ranks: Sequence[RankMetrics]) -> Finding | None:
    """The rank the others wait for, named from measured collective waits (see the module text)."""
    if not waits_measured(ranks):
        return None
    ordered = sorted(ranks, key=lambda m: (m.communication, m.rank))
    culprit, victim = ordered[0], ordered[len(ordered) // 2]
    gap = victim.communication - culprit.communication  # type: ignore[operator]
    assert victim.step_time is not None
    score = gap / victim.step_time
    if gap <= 0 or score < t.STRAGGLER_WARN:
        return None
    kind, cause, covered = straggler_cause(culprit, victim, gap, _CAUSES)
    why = (
        f"Rank {culprit.rank} holds the others back: measured in the collectives, rank {victim.rank} waits "
        f"{gap * 1e3:.1f} ms more per step than rank {culprit.rank}, {score:.0%} of its step time."
    )
    return straggler_finding(kind, score, culprit, victim, gap, covered, why, cause, _ADVICE[kind],
                             Evidence("basis", "measured collective waits"))
