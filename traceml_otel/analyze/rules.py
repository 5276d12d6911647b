"""Step-time rules and the primary verdict.

Rules run in the order straggler, input, h2d, residual, communication, compute. The straggler is
named from measured collective waits where every rank measured them (``communication.py``), else
inferred from backward times (``straggler.py``). Each fires a finding, abstains
(signals it needs were not measured) or stays quiet. Findings are sorted by severity, then
score; the first is the primary diagnosis. With nothing fired the verdict is INCOMPLETE_DATA if a
rule abstained, else BALANCED. Fewer than 20 steps per rank, or FSDP, caps severity at warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.advice import COMPUTE_ADVICE, GENERIC_INPUT_ADVICE, input_bound_advice
from traceml_otel.analyze.between_steps import (
    between_steps_rule,
    between_steps_share,
    input_unmeasured,
    traced_basis,
)
from traceml_otel.analyze.communication_rules import (
    OVERHEAD_PARTS,
    communication_rule,
    largest_part,
    sync_straggler_rule,
    waits_measured,
)
from traceml_otel.analyze.findings import Abstention, Evidence, Finding, RankMetrics, StepDiagnosis
from traceml_otel.analyze.independent import independent_ranks_rule
from traceml_otel.analyze.kinds import SEVERITY_ORDER, Clock, Severity, StepKind
from traceml_otel.analyze.measures import coverage, share
from traceml_otel.analyze.run_model import RankHost
from traceml_otel.analyze.straggler import straggler_rule

_SHARE_NEEDS = {
    "input_wait": ("input_wait", "traced"),
    "h2d": ("input_wait", "traced"),
    "residual": ("input_wait", "traced", "forward", "backward"),
}
_SHARE_TEXT = {
    StepKind.INPUT_BOUND: (
        "input_wait",
        "Input-bound",
        "Waiting for the next batch takes {share:.0%} of the step time (median over ranks).",
        GENERIC_INPUT_ADVICE,
    ),
    StepKind.H2D_BOUND: (
        "h2d",
        "Host-to-device copies dominate",
        "Copying batches to the GPU takes {share:.0%} of the step time (median over ranks).",
        "Copy from pinned memory with non_blocking=True, send fewer and larger tensors, keep static data on "
        "the device, or overlap copies with compute (a prefetching loader on a side stream).",
    ),
    StepKind.RESIDUAL_HEAVY: (
        "residual",
        "Much of the step is outside the model",
        "{share:.0%} of the traced step time is outside forward, backward, optimizer and "
        "copies: per-step logging, metrics, .item() or .cpu() syncs, Python work or callbacks.",
        "Profile the step body for work outside the model: log and compute metrics every N steps instead of "
        "every step, avoid host syncs (.item(), .cpu(), print of tensors), and move expensive callbacks out.",
    ),
}


def _severity(score: float) -> Severity:
    return Severity.CRITICAL if score >= t.SHARE_CRITICAL else Severity.WARNING


def _abstention(rule: str, ranks: Sequence[RankMetrics], signals: Sequence[str]) -> Abstention:
    found = (coverage(ranks, name) for name in signals)
    return Abstention(rule, tuple(cov for cov in found if cov.measured_ranks < cov.observed_ranks))


def share_rule(
    kind: StepKind, ranks: Sequence[RankMetrics], advice_for_run: str | None = None
) -> Finding | Abstention | None:
    """INPUT_BOUND, H2D_BOUND or RESIDUAL_HEAVY: fires when the component's share >= 0.10."""
    name, title, why, advice = _SHARE_TEXT[kind]
    advice = advice_for_run or advice
    value = share(ranks, name)
    if value is None:
        return _abstention(name, ranks, _SHARE_NEEDS[name])
    if value < t.SHARE_WARN:
        return None
    return Finding(
        kind=kind,
        severity=_severity(value),
        score=value,
        title=title,
        why=why.format(share=value) if len(ranks) > 1 else why.format(share=value).replace(
            " (median over ranks)", ""),
        next=advice,
        evidence=(Evidence(f"{name}_share", value, "ratio"),),
    )


def compute_rule(ranks: Sequence[RankMetrics]) -> Finding | Abstention | None:
    """COMPUTE_BOUND: compute share >= 0.90 with input, h2d and residual shares all under 0.10."""
    shares = {name: share(ranks, name) for name in ("compute", "input_wait", "h2d", "residual")}
    if any(value is None for value in shares.values()):
        return _abstention("compute", ranks, _SHARE_NEEDS["residual"])
    compute = shares.pop("compute")
    assert compute is not None
    if compute < t.COMPUTE_SHARE or any(v >= t.SHARE_WARN for v in shares.values()):  # type: ignore[operator]
        return None
    communication = share(ranks, "communication")
    if communication is not None and communication >= t.COMMUNICATION_WARN:
        return None
    why = (f"Forward, backward and optimizer take {compute:.0%} of the step time; input wait, copies and "
           "other work are each under 10%.")
    largest = largest_part(ranks, ("forward", "backward", "optimizer"))
    if largest is not None and largest[1] > 0:  # which part of the compute (the verdict's largest share)
        why += f" The largest part is {_PART_LABELS[largest[0]]}: {largest[1]:.0%} of the step time."
    return Finding(
        kind=StepKind.COMPUTE_BOUND,
        severity=Severity.INFO,
        score=compute,
        title="Compute-bound",
        why=why,
        next=COMPUTE_ADVICE,
        evidence=(Evidence("compute_share", compute, "ratio"),),
    )


def _cap(finding: Finding, caps: Sequence[str]) -> Finding:
    if caps and finding.severity is Severity.CRITICAL:
        return replace(finding, severity=Severity.WARNING)
    return finding


def diagnose_step_time(
    ranks: Sequence[RankMetrics], clock: Clock, parallelism: str, *, source: str = "",
    hosts: Sequence[RankHost] = (),
    extra_caps: Sequence[str] = (),
) -> StepDiagnosis:
    """Run every step-time rule over one window's rank metrics and pick the primary verdict.

    ``extra_caps``: reasons from outside the window (an incomplete local copy) to cap severity at warning.
    """
    if not ranks or all(m.steps == 0 for m in ranks):
        return StepDiagnosis(no_data(source), ())
    fewest = min(m.steps for m in ranks)
    if fewest < t.MIN_STEPS:
        return StepDiagnosis(warmup(fewest), ())
    caps = tuple(
        reason
        for reason, applies in (
            (f"fewer than {t.MIN_STEPS_FOR_CRITICAL} steps per rank", fewest < t.MIN_STEPS_FOR_CRITICAL),
            ("FSDP", parallelism == "fsdp"),
        )
        if applies
    ) + tuple(extra_caps)
    between: Finding | None = None
    compute: Finding | Abstention | None = None
    if input_unmeasured(ranks):  # no fetch timed: judge the traced time, report the time between steps
        between = between_steps_rule(ranks)
        if between_steps_share(ranks) is None:  # compute-bound needs the time between steps small
            compute = _abstention("compute", ranks, ("between_steps",))
        ranks = traced_basis(ranks)
    outcomes = [
        rank_rule(ranks, parallelism),
        between if between is not None else
        share_rule(StepKind.INPUT_BOUND, ranks, input_bound_advice(hosts, clock)),
        share_rule(StepKind.H2D_BOUND, ranks) if clock is Clock.GPU else None,
        share_rule(StepKind.RESIDUAL_HEAVY, ranks),
        communication_rule(ranks),
        compute if compute is not None else compute_rule(ranks),
    ]
    issues = [_cap(o, caps) for o in outcomes if isinstance(o, Finding)
              and not (between is not None and o.kind is StepKind.COMPUTE_BOUND)]
    issues = [_dominated(f, ranks) for f in issues]
    issues.sort(key=lambda f: (-SEVERITY_ORDER[f.severity], -(f.score or 0.0)))
    abstentions = _merge_abstentions([o for o in outcomes if isinstance(o, Abstention)])
    leading = [f for f in issues if not _is_dominated(f)]
    if leading:
        primary = leading[0]
    elif issues:  # only a communication finding that another part outweighs: the verdict reads that part
        primary = balanced(ranks)
    elif abstentions:
        primary = incomplete(abstentions)
    else:
        primary = balanced(ranks)
    return StepDiagnosis(primary, tuple(issues), tuple(abstentions), caps)


_DOMINATED = "largest_part"
"""The evidence a communication finding carries when another part of the step outweighs it."""


def _dominated(finding: Finding, ranks: Sequence[RankMetrics]) -> Finding:
    """A COMMUNICATION_BOUND finding whose transfer share is below another part's share (a 2-process
    Accelerate job whose optimizer takes 41 %, collectives 20 %) is kept as information, never the
    verdict: its why line names the larger part."""
    if finding.kind is not StepKind.COMMUNICATION_BOUND or finding.score is None:
        return finding
    largest = largest_part(ranks, OVERHEAD_PARTS)
    if largest is None or largest[1] <= finding.score:
        return finding
    name, value = largest
    return replace(
        finding, severity=Severity.INFO,
        why=f"{finding.why} Not the verdict: {_PART_LABELS.get(name, name)} takes more, {value:.0%} of the "
            "step time.",
        evidence=(*finding.evidence, Evidence(_DOMINATED, name), Evidence("largest_share", value, "ratio")),
    )


def _is_dominated(finding: Finding) -> bool:
    return any(e.name == _DOMINATED for e in finding.evidence)


def straggler_of(ranks: Sequence[RankMetrics], parallelism: str) -> Finding | Abstention | None:
    """The rank rule as :func:`diagnose_step_time` runs it (on the traced time when no fetch was timed)."""
    return rank_rule(traced_basis(ranks) if input_unmeasured(ranks) else ranks, parallelism)


def rank_rule(ranks: Sequence[RankMetrics], parallelism: str) -> Finding | Abstention | None:
    """Independent processes are compared; ranks that may synchronize are checked for a straggler."""
    if parallelism == "independent":
        return independent_ranks_rule(ranks)
    return sync_straggler_rule(ranks) if waits_measured(ranks) else straggler_rule(ranks, parallelism)


def _merge_abstentions(abstentions: Sequence[Abstention]) -> list[Abstention]:
    return [a for a in abstentions if a.missing]


def missing_signals(abstentions: Sequence[Abstention]) -> list[str]:
    """``signal measured/observed`` for each distinct missing signal, e.g. ``forward 0/2 ranks``."""
    seen: dict[str, str] = {}
    for abstention in abstentions:
        for cov in abstention.missing:
            seen.setdefault(cov.signal, f"{cov.signal} {cov.measured_ranks}/{cov.observed_ranks} ranks")
    return list(seen.values())


def incomplete(abstentions: Sequence[Abstention]) -> Finding:
    """INCOMPLETE_DATA: nothing fired, and rules abstained for missing signals."""
    missing = missing_signals(abstentions)
    rules = ", ".join(a.rule for a in abstentions)
    return Finding(
        kind=StepKind.INCOMPLETE_DATA,
        severity=Severity.INFO,
        score=None,
        title="Insufficient step-time data",
        why=f"Some signals were not measured on every step ({'; '.join(missing)}), so these rules could not "
        f"decide: {rules}.",
        next=(
            "Call the traced model as model(x) (calling model.forward(x) skips the hook), wrap the whole "
            "step in trace_step(), and fetch batches from a DataLoader iterator (or use wrap_forward, "
            "wrap_backward and wrap_dataloader_fetch)."
        ),
        evidence=tuple(
            Evidence(f"coverage.{c.signal}", f"{c.measured_ranks}/{c.observed_ranks}")
            for a in abstentions
            for c in a.missing
        ),
    )


def balanced(ranks: Sequence[RankMetrics]) -> Finding:
    """BALANCED: every rule ran and none fired. The why line names the largest part of the step,
    and the advice points at it (a run whose optimizer takes 41 % reads that, not "nothing stands out")."""
    names = ("input_wait", "h2d", "compute", "communication", "residual")
    parts = {name: share(ranks, name) for name in names}
    text = ", ".join(
        f"{name.replace('_', ' ')} {value:.0%}" for name, value in parts.items() if value is not None
    )
    largest = largest_part(ranks)
    communication = parts["communication"]
    if communication is not None and (largest is None or communication > largest[1]):
        largest = ("communication", communication)
    why = f"No part of the step crosses its threshold ({text})."
    next_ = "Nothing to fix in how the step is spent; to go faster, shorten its largest part."
    if largest is not None and largest[1] > 0:
        name, value = largest
        label = _PART_LABELS.get(name, name)
        why += f" The largest part is {label}: {value:.0%} of the step time."
        next_ = f"To go faster, shorten the largest part, {label}: {_PART_ADVICE.get(name, '')}".rstrip(": ")
    return Finding(
        kind=StepKind.BALANCED,
        severity=Severity.INFO,
        score=None,
        title="Balanced",
        why=why,
        next=next_,
        evidence=(Evidence("largest_part", largest[0]), Evidence("largest_share", largest[1], "ratio"))
        if largest is not None else (),
    )


_PART_LABELS = {
    "input_wait": "input wait", "h2d": "host-to-device copies", "forward": "the forward pass",
    "backward": "the backward pass", "optimizer": "the optimizer step", "residual": "work outside the model",
    "communication": "communication",
}
_PART_ADVICE = {
    "optimizer": "a fused or foreach optimizer, fewer parameter tensors, or a cheaper update rule.",
    "forward": "a cheaper model, torch.compile, or a larger batch per step.",
    "backward": "a cheaper model, torch.compile, or less recomputation.",
    "input_wait": "more DataLoader workers, pinned memory, or cheaper per-sample work.",
    "residual": "less per-step logging and fewer host syncs (.item(), .cpu()).",
    "communication": "fewer, larger collectives, or more overlap with backward.",
    "h2d": "pinned memory with non_blocking=True, and fewer, larger copies.",
}


def warmup(steps: int) -> Finding:
    """WARMUP: fewer than two steps per rank."""
    return Finding(
        kind=StepKind.WARMUP,
        severity=Severity.INFO,
        score=None,
        title="Insufficient step-time data",
        why=f"Only {steps} aligned step(s) per rank: too few to diagnose.",
        next=f"Run more steps (at least {t.MIN_STEPS_FOR_CRITICAL} give a full-strength verdict).",
    )


def no_data(source: str = "") -> Finding:
    """NO_DATA: no usable step spans."""
    where = f" in {source}" if source else ""
    return Finding(
        kind=StepKind.NO_DATA,
        severity=Severity.INFO,
        score=None,
        title="Insufficient step-time data",
        why=f"No usable traceml step spans were found{where}.",
        next=(
            "Under `traceml run` without trace_step, steps are found from the loop's optimizer.step() calls "
            "(or its backward calls when it has no optimizer): check that the script reached its training "
            "loop. Otherwise, check that it calls traceml.init() and wraps each step in trace_step(); with "
            "a trace backend, check --run-id, --service and the --since/--until range."
        ),
    )
