"""Step-time rules at and around every threshold (docs/analyzer.md, diagnosis-semantics)."""

from __future__ import annotations

import pytest

from traceml_otel.analyze.findings import Abstention, Finding, RankMetrics
from traceml_otel.analyze.kinds import Clock, Severity, StepKind
from traceml_otel.analyze.rules import compute_rule, diagnose_step_time, share_rule
from traceml_otel.analyze.straggler import straggler_rule


def rank(
    rank: int = 0,
    *,
    steps: int = 40,
    input_wait: float | None = 0.0,
    forward: float | None = 0.3,
    backward: float | None = 0.6,
    optimizer: float = 0.0,
    h2d: float = 0.0,
    residual: float = 0.0,
    h2d_measured: bool | None = None,
) -> RankMetrics:
    """Rank means built from parts: traced = phases + residual; step time = input wait + traced."""
    traced = (forward or 0.0) + (backward or 0.0) + optimizer + h2d + residual
    compute = None if forward is None or backward is None else forward + backward + optimizer
    return RankMetrics(
        rank=rank,
        steps=steps,
        step_time=None if input_wait is None else input_wait + traced,
        input_wait=input_wait,
        traced=traced,
        forward=forward,
        backward=backward,
        optimizer=optimizer,
        h2d=h2d,
        h2d_measured=h2d > 0 if h2d_measured is None else h2d_measured,
        compute=compute,
        residual=None if compute is None else residual,
        optimizer_updates=steps,
        micro_steps=0,
    )


def split(share: float, rest: str = "backward", **others: float) -> dict[str, float]:
    """Parts of a 1-second step where ``input_wait`` (or another part) has exactly ``share``."""
    return others | {rest: 1.0 - share - sum(others.values())}


# --- share rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("share", "severity"),
    [(0.0999, None), (0.10, Severity.WARNING), (0.1999, Severity.WARNING), (0.20, Severity.CRITICAL)],
)
def test_input_bound_thresholds(share: float, severity: Severity | None) -> None:
    parts = split(share, forward=0.0) | {"input_wait": share}
    outcome = share_rule(StepKind.INPUT_BOUND, [rank(**parts)])
    if severity is None:
        assert outcome is None
    else:
        assert isinstance(outcome, Finding)
        assert outcome.kind is StepKind.INPUT_BOUND and outcome.severity is severity
        assert outcome.score == pytest.approx(share)


@pytest.mark.parametrize(
    ("share", "severity"),
    [(0.0999, None), (0.10, Severity.WARNING), (0.1999, Severity.WARNING), (0.20, Severity.CRITICAL)],
)
def test_residual_heavy_thresholds(share: float, severity: Severity | None) -> None:
    metrics = rank(input_wait=0.0, forward=0.1, backward=0.9 - share, residual=share)
    outcome = share_rule(StepKind.RESIDUAL_HEAVY, [metrics])
    assert (outcome.severity if isinstance(outcome, Finding) else None) is severity


@pytest.mark.parametrize(("share", "fires"), [(0.0999, False), (0.10, True), (0.25, True)])
def test_h2d_bound_only_on_the_gpu_clock(share: float, fires: bool) -> None:
    metrics = [rank(input_wait=0.0, forward=0.1, backward=0.9 - share, h2d=share)]
    gpu = diagnose_step_time(metrics, Clock.GPU, "none")
    cpu = diagnose_step_time(metrics, Clock.CPU, "none")
    assert (StepKind.H2D_BOUND in {f.kind for f in gpu.issues}) is fires
    assert StepKind.H2D_BOUND not in {f.kind for f in cpu.issues}


def test_share_is_the_median_over_ranks() -> None:
    ranks = [rank(0, input_wait=0.05), rank(1, input_wait=0.30), rank(2, input_wait=0.12)]
    finding = share_rule(StepKind.INPUT_BOUND, ranks)
    assert isinstance(finding, Finding)
    assert finding.score == pytest.approx(0.12 / (0.12 + 0.9))


@pytest.mark.parametrize(
    ("compute", "input_wait", "residual", "fires"),
    [
        (0.8999, 0.0, 0.1001, False),
        (0.90, 0.0999, 0.0001, True),
        (0.95, 0.0, 0.05, True),
        (0.91, 0.09, 0.0, True),
    ],
)
def test_compute_bound_thresholds(compute: float, input_wait: float, residual: float, fires: bool) -> None:
    metrics = rank(input_wait=input_wait, forward=compute / 3, backward=compute * 2 / 3, residual=residual)
    outcome = compute_rule([metrics])
    assert isinstance(outcome, Finding) is fires
    if fires:
        assert outcome.severity is Severity.INFO  # type: ignore[union-attr]


def test_compute_bound_needs_every_other_share_under_ten_percent() -> None:
    # compute share 0.90 but h2d at exactly 0.10 blocks it (the other shares must be < 0.10).
    metrics = rank(input_wait=0.0, forward=0.3, backward=0.6, h2d=0.10)
    assert compute_rule([metrics]) is None


# --- missing versus zero ------------------------------------------------------------------------


def test_missing_forward_abstains_instead_of_reading_zero() -> None:
    metrics = rank(forward=None, backward=0.2, residual=0.0, input_wait=0.01)
    residual = share_rule(StepKind.RESIDUAL_HEAVY, [metrics])
    assert isinstance(residual, Abstention)
    assert [(c.signal, c.measured_ranks, c.observed_ranks) for c in residual.missing] == [("forward", 0, 1)]
    diagnosis = diagnose_step_time([metrics], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.INCOMPLETE_DATA
    assert "forward 0/1 ranks" in diagnosis.primary.why


def test_measured_zero_input_wait_is_not_missing() -> None:
    diagnosis = diagnose_step_time([rank(input_wait=0.0)], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.COMPUTE_BOUND
    assert diagnosis.abstentions == ()


def test_missing_input_wait_is_judged_on_traced_time() -> None:
    # no fetch measured (a loop without a DataLoader): the traced time is still judged, not INCOMPLETE_DATA
    from dataclasses import replace

    diagnosis = diagnose_step_time([replace(rank(input_wait=None), between_steps=0.0)], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.COMPUTE_BOUND
    # compute-bound needs the time between steps under 10 % too: unknown (metrics from a run shorter
    # than a scrape interval), it is not claimed
    unknown = diagnose_step_time([rank(input_wait=None)], Clock.CPU, "none")
    assert unknown.primary.kind is StepKind.INCOMPLETE_DATA
    assert "between_steps 0/1 ranks" in unknown.primary.why
    heavy = diagnose_step_time([rank(input_wait=None, residual=0.3)], Clock.CPU, "none")
    assert heavy.primary.kind is StepKind.RESIDUAL_HEAVY
    assert heavy.primary.score == pytest.approx(0.25)  # 0.3 of a 1.2 s traced step
    # a phase that was not measured still cannot be judged
    missing = diagnose_step_time([rank(input_wait=None, forward=None)], Clock.CPU, "none")
    assert missing.primary.kind is StepKind.INCOMPLETE_DATA
    assert "forward 0/1 ranks" in missing.primary.why


@pytest.mark.parametrize(
    ("between", "kind", "severity"),
    [(0.0, StepKind.COMPUTE_BOUND, Severity.INFO), (0.099, StepKind.COMPUTE_BOUND, Severity.INFO),
     (0.1, StepKind.BETWEEN_STEPS, Severity.WARNING), (0.2, StepKind.BETWEEN_STEPS, Severity.CRITICAL)],
)
def test_time_between_steps_is_its_own_finding_where_fetches_are_not_measured(
    between: float, kind: StepKind, severity: Severity
) -> None:
    from dataclasses import replace

    base = rank(input_wait=None, forward=0.3, backward=0.6, optimizer=0.1)  # 1 s traced
    metrics = replace(base, between_steps=between / (1 - between))  # that share of between + traced
    diagnosis = diagnose_step_time([metrics], Clock.CPU, "none")
    assert (diagnosis.primary.kind, diagnosis.primary.severity) == (kind, severity)
    if kind is StepKind.BETWEEN_STEPS:
        assert "not measured as input wait" in diagnosis.primary.why
        assert "wrap_dataloader_fetch" in diagnosis.primary.next
        assert not any(f.kind is StepKind.COMPUTE_BOUND for f in diagnosis.issues)
    # with fetches measured, the input rule decides and the time between steps is no finding
    measured = diagnose_step_time([replace(metrics, input_wait=0.0, step_time=1.0)], Clock.CPU, "none")
    assert not any(f.kind is StepKind.BETWEEN_STEPS for f in measured.issues)


def test_coverage_counts_measured_over_observed_ranks() -> None:
    ranks = [rank(0, forward=None), rank(1, forward=None), rank(2)]
    diagnosis = diagnose_step_time(ranks, Clock.CPU, "none")
    missing = {
        c.signal: (c.measured_ranks, c.observed_ranks) for a in diagnosis.abstentions for c in a.missing
    }
    assert missing["forward"] == (1, 3)


# --- verdict assembly ---------------------------------------------------------------------------


def test_no_data_and_warmup() -> None:
    assert diagnose_step_time([], Clock.CPU, "none").primary.kind is StepKind.NO_DATA
    assert diagnose_step_time([rank(steps=1)], Clock.CPU, "none").primary.kind is StepKind.WARMUP
    assert diagnose_step_time([rank(steps=2)], Clock.CPU, "none").primary.kind is not StepKind.WARMUP


def test_balanced_when_nothing_fires_and_nothing_is_missing() -> None:
    metrics = rank(input_wait=0.05, forward=0.3, backward=0.5, residual=0.05, optimizer=0.05)
    diagnosis = diagnose_step_time([metrics], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.BALANCED
    assert diagnosis.issues == ()


@pytest.mark.parametrize(("steps", "severity"), [(19, Severity.WARNING), (20, Severity.CRITICAL)])
def test_fewer_than_twenty_steps_caps_severity(steps: int, severity: Severity) -> None:
    diagnosis = diagnose_step_time([rank(steps=steps, input_wait=0.5)], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.INPUT_BOUND
    assert diagnosis.primary.severity is severity
    assert bool(diagnosis.caps) is (steps < 20)


def test_fsdp_caps_severity() -> None:
    diagnosis = diagnose_step_time([rank(input_wait=0.5)], Clock.CPU, "fsdp")
    assert diagnosis.primary.severity is Severity.WARNING
    assert "FSDP" in diagnosis.caps


def test_findings_sort_by_severity_then_score() -> None:
    # input 0.15 (warning), residual 0.25 (critical): residual leads despite rule order.
    metrics = rank(input_wait=0.15, forward=0.2, backward=0.4, residual=0.25)
    diagnosis = diagnose_step_time([metrics], Clock.CPU, "none")
    assert [f.kind for f in diagnosis.issues] == [StepKind.RESIDUAL_HEAVY, StepKind.INPUT_BOUND]
    # both critical: the higher score leads.
    metrics = rank(input_wait=0.30, forward=0.1, backward=0.35, residual=0.25)
    diagnosis = diagnose_step_time([metrics], Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.INPUT_BOUND


# --- stragglers --------------------------------------------------------------------------------


def ddp_pair(gap: float, *, culprit_extra: dict[str, float], victim_step: float = 1.0) -> list[RankMetrics]:
    """Rank 1 (the culprit) waits ``gap`` s less in backward than rank 0 (the victim)."""
    victim = rank(0, input_wait=0.0, forward=0.2, backward=0.3 + gap, residual=victim_step - 0.5 - gap)
    parts = {"input_wait": 0.0, "forward": 0.2, "backward": 0.3, "residual": victim_step - 0.5 - gap}
    for name, value in culprit_extra.items():
        parts[name] = parts.get(name, 0.0) + value
    return [victim, rank(1, **parts)]


@pytest.mark.parametrize(
    ("gap", "severity"),
    [(0.0999, None), (0.10, Severity.WARNING), (0.1999, Severity.WARNING), (0.20, Severity.CRITICAL)],
)
def test_straggler_score_thresholds(gap: float, severity: Severity | None) -> None:
    outcome = straggler_rule(ddp_pair(gap, culprit_extra={"input_wait": gap}), "ddp")
    if severity is None:
        assert outcome is None
        return
    assert isinstance(outcome, Finding)
    assert outcome.kind is StepKind.INPUT_STRAGGLER and outcome.severity is severity
    assert outcome.score == pytest.approx(gap)  # victim step time is 1 s


@pytest.mark.parametrize(("covered", "kind"), [(0.79, StepKind.STRAGGLER), (0.80, StepKind.INPUT_STRAGGLER)])
def test_straggler_cause_needs_eighty_percent_coverage(covered: float, kind: StepKind) -> None:
    outcome = straggler_rule(ddp_pair(0.2, culprit_extra={"input_wait": 0.2 * covered}), "ddp")
    assert isinstance(outcome, Finding) and outcome.kind is kind
    culprit = {e.name: e.value for e in outcome.evidence}["culprit_rank"]
    assert culprit == 1


def test_compute_straggler_from_forward_excess() -> None:
    outcome = straggler_rule(ddp_pair(0.2, culprit_extra={"forward": 0.2}), "ddp")
    assert isinstance(outcome, Finding) and outcome.kind is StepKind.COMPUTE_STRAGGLER


def test_h2d_straggler_only_when_both_ranks_measured_h2d() -> None:
    pair = ddp_pair(0.2, culprit_extra={"h2d": 0.2})
    outcome = straggler_rule(pair, "ddp")
    assert isinstance(outcome, Finding) and outcome.kind is StepKind.STRAGGLER  # victim has no h2d
    victim = rank(0, input_wait=0.0, forward=0.2, backward=0.5, h2d=0.0, h2d_measured=True, residual=0.3)
    outcome = straggler_rule([victim, pair[1]], "ddp")
    assert isinstance(outcome, Finding) and outcome.kind is StepKind.H2D_STRAGGLER


def test_fsdp_straggler_uses_forward_plus_backward_and_ignores_forward_excess() -> None:
    victim = rank(0, input_wait=0.0, forward=0.35, backward=0.6, residual=0.05)
    culprit = rank(1, input_wait=0.0, forward=0.45, backward=0.3, residual=0.25)
    # visible gap = 0.95 - 0.75 = 0.2; the forward excess (0.1) is not a cause under FSDP.
    outcome = straggler_rule([victim, culprit], "fsdp")
    assert isinstance(outcome, Finding) and outcome.kind is StepKind.STRAGGLER
    assert outcome.score == pytest.approx(0.2)
    diagnosis = diagnose_step_time([victim, culprit], Clock.CPU, "fsdp")
    assert diagnosis.primary.kind is StepKind.STRAGGLER and diagnosis.primary.severity is Severity.WARNING


def test_straggler_victim_is_the_upper_median_rank() -> None:
    ranks = [
        rank(0, backward=0.6, residual=0.1),
        rank(1, backward=0.2, input_wait=0.4, residual=0.1),
        rank(2, backward=0.5, residual=0.1),
        rank(3, backward=0.55, residual=0.1),
    ]
    outcome = straggler_rule(ranks, "ddp")
    assert isinstance(outcome, Finding)
    evidence = {e.name: e.value for e in outcome.evidence}
    assert evidence["culprit_rank"] == 1 and evidence["victim_rank"] == 3  # sorted 0.2, 0.5, 0.55, 0.6


def test_straggler_abstains_without_input_wait_and_is_silent_for_one_rank() -> None:
    ranks = [rank(0, input_wait=None), rank(1, input_wait=None, backward=0.1)]
    outcome = straggler_rule(ranks, "ddp")
    assert isinstance(outcome, Abstention)
    assert {c.signal for c in outcome.missing} >= {"input_wait"}
    assert straggler_rule([rank(0)], "ddp") is None
