"""Rules on measured collective time: COMMUNICATION_BOUND, and stragglers named from measured waits.

Each rank's *exposed* communication (the part of its collective time the step waited for) is split
into *waiting* for the last rank to arrive and *transfer* once all had arrived
(``communication_split.py``, from the ranks' entry times into each collective of a step).

- COMMUNICATION_BOUND means the transfer itself costs: the median over ranks of transfer / step
  time is >= 10 %. Waiting that a slow rank causes is that rank's straggler finding, never this one.
  Its advice follows the regime: many small collectives (< 1 MiB each) pay latency per call; large
  ones pay bandwidth.
- The sync straggler is the rank the others' waiting is attributed to (the culprit); the victim is
  the rank that waited most for it, and ``score = (victim waiting - culprit waiting) / victim step
  time``, the same scale and thresholds as the inferred straggler rule in ``straggler.py``, which
  stays the fallback where waits were not measured on every rank.

Without a split (one rank) the transfer is the whole exposed time: there is nobody to wait for.

COMMUNICATION_BOUND is the primary verdict only where communication dominates the work around the
model: where input wait, copies, the optimizer or the residual takes a larger share than the transfer
(a 2-process Accelerate job whose optimizer takes 41 %, its collectives 20 %), the finding stays, as
information, and the verdict reads that part (:func:`largest_part`, ``rules.py``). Forward and
backward are not weighed against it: every data-parallel step's collectives run beside the model's
compute, and a backward longer than its all-reduce is no reason to leave the bytes unexplained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Evidence, Finding, RankMetrics
from traceml_otel.analyze.kinds import Severity, StepKind
from traceml_otel.analyze.measures import share
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


def _split_or_estimate(ranks: Sequence[RankMetrics]) -> Sequence[RankMetrics]:
    """The ranks with their split; where none was made per step (metrics built without steps), the
    clock-free estimate on the means: the least-waiting rank's exposed time is the transfer."""
    if len(ranks) < 2 or all(m.communication_transfer is not None for m in ranks):
        return ranks
    least = min(ranks, key=lambda m: (m.communication, m.rank))
    floor = least.communication
    assert floor is not None
    return [
        replace(m, communication_transfer=floor, communication_waiting=m.communication - floor,  # type: ignore[operator]
                waited_for=((least.rank, m.communication - floor),) if m is not least else (),  # type: ignore[operator]
                split_basis="least-waiting rank")
        for m in ranks
    ]


def _waiting(m: RankMetrics) -> float:
    """Waiting for other ranks per step (the exposed time where it was not split)."""
    value = m.communication_waiting if m.communication_waiting is not None else m.communication
    assert value is not None
    return value


def _transfer(m: RankMetrics) -> float:
    value = m.communication_transfer if m.communication_transfer is not None else m.communication
    assert value is not None
    return value


def byte_size(value: float) -> str:
    """``512 B``, ``4.0 KiB``, ``38.2 MiB``, ``1.50 GiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}" if unit != "GiB" else f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def _milliseconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value < 1e-3 else f"{value * 1e3:.1f} ms"


def communication_rule(ranks: Sequence[RankMetrics]) -> Finding | None:
    """COMMUNICATION_BOUND: the transfer (exposed time less waiting for other ranks) takes >= 10 % of
    the step, median over ranks.

    Silent when no rank measured collectives (a single process, timing off) or the exposed part was
    not measured on every rank: it never claims anything about unmeasured communication.
    """
    if not ranks or not all(
        m.communication_measured and m.communication is not None and m.step_time for m in ranks
    ):
        return None
    ranks = _split_or_estimate(ranks)
    shares = sorted((_transfer(m) / m.step_time, m.rank) for m in ranks)  # type: ignore[operator]
    score, middle_rank = shares[(len(shares) - 1) // 2]
    if score < t.COMMUNICATION_WARN:
        return None
    middle = next(m for m in ranks if m.rank == middle_rank)
    transfer, waiting = _transfer(middle), _waiting(middle) if len(ranks) > 1 else 0.0
    calls = middle.communication_calls or 0.0
    per_step = middle.communication_bytes or 0.0
    per_call = per_step / calls if calls else 0.0
    latency = calls > 0 and per_call < t.COMMUNICATION_LATENCY_BYTES
    total = middle.communication_total
    overlap = ""
    if total is not None and total > 0 and middle.communication is not None:
        overlap = f"; {1 - middle.communication / total:.0%} of all its collective time overlaps compute"
    how_many = calls_per_step(calls)
    regime = (
        f"{how_many} per step of {byte_size(per_call)} each "
        f"({_milliseconds(transfer / calls)} per call): latency, not bytes, is the cost" if latency else
        f"{byte_size(per_step)} per step in {how_many}: the bytes cost (bandwidth)"
    )
    split = (
        f", after {_milliseconds(waiting)} waiting for other ranks to arrive" if len(ranks) > 1 else ""
    )
    return Finding(
        kind=StepKind.COMMUNICATION_BOUND,
        severity=Severity.CRITICAL if score >= t.COMMUNICATION_CRITICAL else Severity.WARNING,
        score=score,
        title="Communication-bound",
        why=(
            f"The collectives themselves take {score:.0%} of the step (median over ranks; "
            f"rank {middle.rank}: "
            f"{_milliseconds(transfer)} of transfer per step once every rank had arrived{split}"
            f"{overlap}). {regime}."
        ),
        next=LATENCY_ADVICE if latency else BANDWIDTH_ADVICE,
        evidence=(
            Evidence("communication_share", score, "ratio"),
            Evidence("communication_rank", middle.rank, "rank"),
            Evidence("transfer", transfer, "s"),
            Evidence("waiting", waiting, "s"),
            Evidence("exposed_communication", middle.communication, "s"),
            Evidence("total_communication", total, "s"),
            Evidence("communication_bytes", per_step, "By"),
            Evidence("communication_calls", calls, "{call}"),
            Evidence("regime", "latency" if latency else "bandwidth"),
        ),
    )


PARTS = ("input_wait", "h2d", "forward", "backward", "optimizer", "residual")
"""The parts of a step besides communication that a verdict can name as its largest."""


OVERHEAD_PARTS = ("input_wait", "h2d", "optimizer", "residual")
"""The parts around the model's forward and backward that can outweigh communication."""


def largest_part(ranks: Sequence[RankMetrics], parts: Sequence[str] = PARTS) -> tuple[str, float] | None:
    """The one of ``parts`` with the largest share, median over ranks (``None``: none measured)."""
    found = [(value, name) for name in parts if (value := share(ranks, name)) is not None]
    if not found:
        return None
    value, name = max(found)
    return name, value


LATENCY_ADVICE = (
    "Make fewer, larger collectives: each call pays a fixed latency whatever its size. Put small tensors "
    "in one flat buffer and reduce it once (or torch.distributed's coalesced calls), raise DDP's "
    "bucket_cap_mb so gradients go in fewer buckets, move per-step metric all_reduces to every N steps, "
    "and sync gradients less often (DDP no_sync over micro-batches)."
)
BANDWIDTH_ADVICE = (
    "Send fewer bytes or hide them behind compute: compress gradients (a bf16/fp16 or PowerSGD "
    "communication hook), let reduction overlap backward (DDP's bucket_cap_mb so it starts earlier), "
    "accumulate gradients over more micro-batches (DDP no_sync) or use a larger batch per rank, and check "
    "the network (NCCL over NVLink/InfiniBand, not TCP)."
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
    ranks = _split_or_estimate(ranks)
    culprit, victim = _culprit_and_victim(ranks)
    gap = _waiting(victim) - _waiting(culprit)
    assert victim.step_time is not None
    score = gap / victim.step_time
    if gap <= 0 or score < t.STRAGGLER_WARN:
        return None
    kind, cause, covered = straggler_cause(culprit, victim, gap, _CAUSES)
    basis = victim.split_basis or "least-waiting rank"
    why = (
        f"Rank {culprit.rank} holds the others back: measured in the collectives, rank {victim.rank} waits "
        f"{_milliseconds(gap)} more per step than rank {culprit.rank} for the last rank to arrive, "
        f"{score:.0%} of its step time."
    )
    blamed = dict(victim.waited_for).get(culprit.rank)
    if blamed is not None and victim.communication_waiting is not None:
        waited = _milliseconds(victim.communication_waiting)
        why += (f" Of rank {victim.rank}'s {waited} of waiting per step, {_milliseconds(blamed)} was for "
                f"rank {culprit.rank} (from the ranks' {basis}).")
    return straggler_finding(kind, score, culprit, victim, gap, covered, why, cause, _ADVICE[kind],
                             Evidence("basis", "measured collective waits"),
                             Evidence("split_basis", basis),
                             Evidence("waiting_for_culprit", blamed, "s"))


def _culprit_and_victim(ranks: Sequence[RankMetrics]) -> tuple[RankMetrics, RankMetrics]:
    """The rank most waited for, and the rank that waited most for it (by waiting, upper median when
    the waiting was not attributed)."""
    blamed: dict[int, float] = {}
    for m in ranks:
        for rank, seconds in m.waited_for:
            blamed[rank] = blamed.get(rank, 0.0) + seconds
    if blamed:
        culprit_rank = min(blamed, key=lambda r: (-blamed[r], r))
        culprit = next((m for m in ranks if m.rank == culprit_rank), None)
        if culprit is not None:
            victim = max(
                (m for m in ranks if m.rank != culprit_rank),
                key=lambda m: (dict(m.waited_for).get(culprit_rank, 0.0), -m.rank),
            )
            return culprit, victim
    ordered = sorted(ranks, key=lambda m: (_waiting(m), m.rank))
    return ordered[0], ordered[len(ordered) // 2]


def calls_per_step(calls: float) -> str:
    """A mean count of collectives per step, said as a count: ``2 collectives``, ``about 2 collectives``
    (1.975: a step or two had one fewer), ``1.5 collectives`` (half the steps have one more)."""
    whole = round(calls)
    if calls == whole:
        number = f"{whole:,}"
    elif abs(calls - whole) <= 0.1 * max(whole, 1):
        number = f"about {whole:,}"
    else:
        number = f"{calls:,.1f}"
    return f"{number} collective{'' if number in ('1', 'about 1') else 's'}"
