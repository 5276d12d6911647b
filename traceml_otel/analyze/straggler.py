"""The rank-straggler rule.

In data-parallel training every rank meets the others in the gradient all-reduce inside
backward, so the rank that arrives last waits least there: its *visible* phase (backward; for
FSDP forward + backward) is the shortest. That rank is the culprit; the upper-median rank is the
victim. The gap between their visible times, over the victim's step time, is the score. Whatever
the culprit spent more on than the victim (input wait, h2d, forward) and that covers most of the
gap names the cause.
"""

from __future__ import annotations

from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Abstention, Evidence, Finding, RankMetrics
from traceml_otel.analyze.kinds import Severity, StepKind
from traceml_otel.analyze.measures import coverage

INPUT_CAUSE = (StepKind.INPUT_STRAGGLER, "input_wait", "waiting for input")
H2D_CAUSE = (StepKind.H2D_STRAGGLER, "h2d", "copying to the device")
"""Causes both straggler rules look for, as (kind, ``RankMetrics`` field, words); each adds its own
compute cause."""
_CAUSES = (INPUT_CAUSE, H2D_CAUSE, (StepKind.COMPUTE_STRAGGLER, "forward", "in forward"))

SHARED_ADVICE = {
    StepKind.INPUT_STRAGGLER: (
        "Look at rank {c}'s data path: its shard (bigger or slower files), its DataLoader workers, and "
        "CPU or disk contention on its host. Balance the work per rank or add loader workers there."
    ),
    StepKind.H2D_STRAGGLER: (
        "Look at rank {c}'s host-to-device copies: pinned memory, NUMA placement of its process and "
        "the size of the batches it receives."
    ),
    StepKind.STRAGGLER: (
        "No measured phase explains why rank {c} arrives late: look for work it does outside the phases "
        "(logging, checkpoint or metric I/O on one rank), host contention, or a slower device."
    ),
}
"""The "Next" line of both straggler rules for an input, H2D or unexplained straggler ({c}: its rank)."""
_ADVICE = {
    **SHARED_ADVICE,
    StepKind.COMPUTE_STRAGGLER: (
        "Rank {c} computes longer in forward: check for uneven batch sizes or sequence lengths, a slower "
        "or throttled device, or another process sharing it."
    ),
}


def _visible(metrics: RankMetrics, fsdp: bool) -> float:
    assert metrics.backward is not None
    if fsdp:
        assert metrics.forward is not None
        return metrics.forward + metrics.backward
    return metrics.backward


def straggler_rule(ranks: Sequence[RankMetrics], parallelism: str) -> Finding | Abstention | None:
    """A straggler finding, an abstention for missing signals, or ``None`` (no straggler / one rank)."""
    if len(ranks) < 2:
        return None
    fsdp = parallelism == "fsdp"
    needed = ["input_wait", "backward", "step_time"] + (["forward"] if fsdp else [])
    eligible = [
        m
        for m in ranks
        if all(getattr(m, name) is not None for name in needed) and m.backward > 0 and m.step_time > 0  # type: ignore[operator]
    ]
    if len(eligible) < 2:
        missing = tuple(
            cov for cov in (coverage(ranks, name) for name in needed) if cov.measured_ranks < len(ranks)
        )
        return Abstention("straggler", missing) if missing else None
    ordered = sorted(eligible, key=lambda m: (_visible(m, fsdp), m.rank))
    culprit, victim = ordered[0], ordered[len(ordered) // 2]
    gap = _visible(victim, fsdp) - _visible(culprit, fsdp)
    victim_step = victim.step_time
    assert victim_step is not None
    score = gap / victim_step
    if gap <= 0 or score < t.STRAGGLER_WARN:
        return None
    kind, cause, covered = straggler_cause(culprit, victim, gap, _CAUSES, fsdp=fsdp)
    phase = "forward + backward" if fsdp else "backward"
    why = (
        f"Rank {culprit.rank} holds the others back: rank {victim.rank} spends {gap * 1e3:.1f} ms more "
        f"per step in {phase} (waiting in the collectives), {score:.0%} of its step time."
    )
    return straggler_finding(kind, score, culprit, victim, gap, covered, why, cause, _ADVICE[kind])


def straggler_finding(
    kind: StepKind,
    score: float,
    culprit: RankMetrics,
    victim: RankMetrics,
    gap: float,
    covered: float,
    why: str,
    cause: str | None,
    advice: str,
    *extra: Evidence,
) -> Finding:
    """The straggler finding both rules give: ``why`` plus the culprit's cause, and the ranks named."""
    if cause:
        why += f" Rank {culprit.rank} spends that time {cause} ({covered:.0%} of the gap)."
    return Finding(
        kind=kind,
        severity=Severity.CRITICAL if score >= t.STRAGGLER_CRITICAL else Severity.WARNING,
        score=score,
        title=f"Rank {culprit.rank} is a straggler",
        why=why,
        next=advice.format(c=culprit.rank),
        evidence=(
            Evidence("culprit_rank", culprit.rank, "rank"),
            Evidence("victim_rank", victim.rank, "rank"),
            Evidence("gap", gap, "s"),
            Evidence("coverage", covered, "ratio"),
            *extra,
        ),
    )


def straggler_cause(
    culprit: RankMetrics,
    victim: RankMetrics,
    gap: float,
    causes: Sequence[tuple[StepKind, str, str]],
    *,
    fsdp: bool = False,
) -> tuple[StepKind, str, float]:
    """The culprit's excess over the victim, among ``causes`` (kind, metric, words), with the highest
    coverage of the gap; ``STRAGGLER`` with no words unless it reaches STRAGGLER_COVERAGE."""
    best: tuple[StepKind, str, float] = (StepKind.STRAGGLER, "", 0.0)
    for kind, name, words in causes:
        if name == "h2d" and not (culprit.h2d_measured and victim.h2d_measured):
            continue
        if name == "forward" and fsdp:
            continue
        mine, theirs = getattr(culprit, name), getattr(victim, name)
        if mine is None or theirs is None:
            continue
        covered = min(1.0, max(0.0, mine - theirs) / gap)
        if covered > best[2]:
            best = (kind, words, covered)
    if best[2] >= t.STRAGGLER_COVERAGE:
        return best
    return StepKind.STRAGGLER, "", best[2]
