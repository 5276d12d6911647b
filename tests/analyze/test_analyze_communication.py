"""COMMUNICATION_BOUND and the sync straggler from measured waits, at their thresholds; the step
model takes measured waits out of the phases; runs without collectives claim nothing."""

from __future__ import annotations

import pytest

from traceml_otel.analyze.communication_rules import communication_rule, sync_straggler_rule, waits_measured
from traceml_otel.analyze.findings import RankMetrics
from traceml_otel.analyze.kinds import Clock, Severity, StepKind
from traceml_otel.analyze.measures import rank_metrics
from traceml_otel.analyze.rules import compute_rule, diagnose_step_time
from traceml_otel.analyze.run_model import StepTiming


def rank(
    number: int = 0, *, communication: float | None = 0.0, compute: float = 0.9, input_wait: float = 0.0,
    measured: bool = True, residual: float = 0.0,
) -> RankMetrics:
    """A rank whose 1 s step (plus its wait) is compute + communication + residual + input wait."""
    exposed = communication or 0.0
    traced = compute + exposed + residual
    return RankMetrics(
        rank=number, steps=40, step_time=input_wait + traced, input_wait=input_wait, traced=traced,
        forward=compute / 3, backward=2 * compute / 3, optimizer=0.0, h2d=0.0, h2d_measured=False,
        compute=compute, residual=residual, optimizer_updates=40, micro_steps=0,
        communication=communication if measured else None,
        communication_total=exposed * 2 if measured else None,
        communication_bytes=1 << 24 if measured else None, communication_measured=measured,
    )


@pytest.mark.parametrize(
    ("least", "severity"),
    [(0.0999, None), (0.10, Severity.WARNING), (0.1999, Severity.WARNING), (0.20, Severity.CRITICAL)],
)
def test_communication_bound_thresholds_on_the_least_waiting_rank(least: float, severity) -> None:
    ranks = [
        rank(0, communication=least, compute=1 - least),
        rank(1, communication=0.5, compute=0.5),  # waits longer: a straggler's doing, not bandwidth
    ]
    finding = communication_rule(ranks)
    if severity is None:
        assert finding is None
        return
    assert finding is not None and finding.kind is StepKind.COMMUNICATION_BOUND
    assert finding.severity is severity and finding.score == pytest.approx(least)
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["communication_rank"] == 0 and evidence["communication_bytes"] == 1 << 24


def test_no_collectives_or_unmeasured_exposure_claims_nothing() -> None:
    quiet = [rank(0, communication=None, measured=False), rank(1, communication=None, measured=False)]
    assert communication_rule(quiet) is None and sync_straggler_rule(quiet) is None
    assert not waits_measured(quiet)
    unknown = [rank(0, communication=None), rank(1, communication=0.5)]  # exposure not measured on rank 0
    assert communication_rule(unknown) is None and not waits_measured(unknown)
    single = [rank(0, communication=None, measured=False)]
    diagnosis = diagnose_step_time(single, Clock.CPU, "none")
    assert diagnosis.primary.kind is StepKind.COMPUTE_BOUND
    assert "communication" not in diagnosis.primary.why


def test_comm_bound_run_is_no_longer_compute_bound() -> None:
    ranks = [rank(0, communication=0.3, compute=0.7), rank(1, communication=0.31, compute=0.69)]
    assert compute_rule(ranks) is None
    diagnosis = diagnose_step_time(ranks, Clock.CPU, "ddp")
    assert diagnosis.primary.kind is StepKind.COMMUNICATION_BOUND
    assert diagnosis.primary.severity is Severity.CRITICAL


def test_sync_straggler_is_the_rank_that_waits_least() -> None:
    # Rank 2 computes 0.4 s more; ranks 0, 1 and 3 wait that long for it in the all-reduce.
    ranks = [
        rank(0, communication=0.45, compute=0.6),
        rank(1, communication=0.44, compute=0.61),
        rank(2, communication=0.05, compute=1.0),
        rank(3, communication=0.45, compute=0.6),
    ]
    finding = sync_straggler_rule(ranks)
    assert finding is not None and finding.kind is StepKind.COMPUTE_STRAGGLER
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["culprit_rank"] == 2 and evidence["victim_rank"] == 0
    assert evidence["basis"] == "measured collective waits"
    assert finding.score == pytest.approx(0.40 / 1.05) and finding.severity is Severity.CRITICAL
    primary = diagnose_step_time(ranks, Clock.CPU, "ddp").primary
    assert primary.kind is StepKind.COMPUTE_STRAGGLER  # the measured rule replaces the inferred one


def test_sync_straggler_below_threshold_and_unexplained_gap() -> None:
    even = [rank(0, communication=0.10), rank(1, communication=0.05)]
    assert sync_straggler_rule(even) is None  # gap 0.05 s of a 1.1 s step: under 10 %
    unexplained = [rank(0, communication=0.5, compute=0.5), rank(1, communication=0.1, compute=0.5,
                                                                  residual=0.4)]
    finding = sync_straggler_rule(unexplained)
    assert finding is not None and finding.kind is StepKind.STRAGGLER
    assert {e.name: e.value for e in finding.evidence}["culprit_rank"] == 1


def _step(rank_number: int, step: int, **fields) -> StepTiming:
    base = StepTiming(
        "run", rank_number, step, traced_cpu=0.010, input_wait_cpu=0.001, phase_calls=(1, 1, 1, 0),
        phase_cpu=(0.002, 0.006, 0.001, None), optimizer_steps=1,
    )
    return base._replace(**fields)


def test_step_model_moves_measured_waits_out_of_backward() -> None:
    steps = [
        _step(0, 0, comm_calls=2, comm_bytes=4096, comm_cpu=0.005, comm_exposed_cpu=0.003,
              phase_comm_cpu=(0.0, 0.003, 0.0, 0.0)),
        _step(0, 1),  # a step without collectives (e.g. a no_sync micro-step) counts 0
    ]
    metrics, _ = rank_metrics(0, steps, Clock.CPU)
    assert metrics.communication == pytest.approx(0.0015)
    assert metrics.communication_total == pytest.approx(0.0025)
    assert metrics.communication_bytes == 2048 and metrics.communication_measured
    assert metrics.backward == pytest.approx((0.003 + 0.006) / 2)
    assert metrics.compute == pytest.approx((0.006 + 0.009) / 2)
    assert metrics.residual == pytest.approx(0.001)  # 10 ms traced - 9 ms phases, waits excluded


def test_unmeasured_exposure_leaves_phases_untouched_and_communication_unknown() -> None:
    steps = [_step(0, 0, comm_calls=1, comm_bytes=8, comm_cpu=0.004, phase_comm_cpu=(0.0, 0.0, 0.0, 0.0))]
    metrics, _ = rank_metrics(0, steps, Clock.CPU)
    assert metrics.communication is None and metrics.communication_measured
    assert metrics.backward == pytest.approx(0.006)
    plain, _ = rank_metrics(0, [_step(0, 0)], Clock.CPU)
    assert plain.communication is None and not plain.communication_measured


def test_assembler_reads_communication_and_knows_collective_spans_without_names() -> None:
    from traceml_otel import contract as c
    from traceml_otel.analyze.assembler import StepAssembler

    assembler = StepAssembler()
    common = {c.ATTR_RUN_ID: "run", c.ATTR_RANK: 1, c.ATTR_STEP: 0}
    span = {"startTimeUnixNano": "0", "endTimeUnixNano": "10000000", "traceId": "ab" * 16}
    step_attributes = {
        **common, c.ATTR_STEP_CPU_DURATION: 0.01, c.ATTR_COMM_CALLS: 3, c.ATTR_COMM_BYTES: 96,
        c.ATTR_COMM_CPU: 0.004, c.ATTR_COMM_EXPOSED_CPU: 0.002,
    }
    assert assembler.add_span(c.SPAN_STEP, step_attributes, span)
    assert assembler.add_span("traceml.backward", {**common, c.ATTR_PHASE_CPU_DURATION: 0.005,
                                                   c.ATTR_PHASE_COMM_EXPOSED_CPU: 0.0015}, span)
    # A TraceQL select() answer carries no span name: the collective kind identifies the span.
    assert assembler.add_span(None, {**common, c.ATTR_COLLECTIVE_KIND: "all_reduce"}, span)
    assert assembler.foreign_spans == 0
    (step,), _ = assembler.steps("run")
    assert (step.comm_calls, step.comm_bytes, step.comm_cpu, step.comm_exposed_cpu) == (3, 96, 0.004, 0.002)
    assert step.comm_exposed_gpu is None and step.phase_comm_cpu[1] == 0.0015
    assert step.communication(Clock.CPU) == 0.002 and step.communication(Clock.GPU) is None


@pytest.mark.parametrize(
    ("culprit_input", "kind"), [(0.45, StepKind.INPUT_STRAGGLER), (0.05, StepKind.STRAGGLER)]
)
def test_measured_and_inferred_straggler_give_the_same_advice_for_a_shared_cause(
    culprit_input: float, kind: StepKind
) -> None:
    from traceml_otel.analyze.straggler import straggler_rule

    # Measured: rank 2 arrives 0.4 s late, the others wait for it in the collectives.
    measured = [rank(n, communication=0.45, compute=0.6, input_wait=0.05) for n in (0, 1, 3)]
    measured.insert(2, rank(2, communication=0.05, compute=0.6, input_wait=culprit_input))
    # Inferred (no collective timing): the others' backward holds the wait, rank 2's is the shortest.
    inferred = [rank(n, communication=None, measured=False, compute=1.0, input_wait=0.05) for n in (0, 1, 3)]
    inferred.insert(2, rank(2, communication=None, measured=False, compute=0.55, input_wait=culprit_input))
    from_waits, from_backward = sync_straggler_rule(measured), straggler_rule(inferred, "ddp")
    assert from_waits is not None and from_backward is not None
    assert from_waits.kind is from_backward.kind is kind
    assert from_waits.next == from_backward.next and "rank 2" in from_waits.next


@pytest.mark.parametrize(
    ("wait", "kind"), [(0.003, StepKind.COMMUNICATION_BOUND), (0.001, StepKind.BALANCED)]
)
def test_ddp_waits_written_by_the_emitter_are_read_from_a_local_copy(tmp_path, wait: float, kind) -> None:
    """End to end through the emitter's exposure math, span builder and local copy: 3 ms of a 14.5 ms
    step is 21 % (critical), 1 ms is 7 % (below the 10 % warning)."""
    from tests.synthetic_runs import BUCKET_BYTES, SyntheticStep, write_run
    from traceml_otel.analyze.pipeline import analyze_path

    steps = [SyntheticStep(rank=r, step=n, world_size=2, parallelism="ddp", ddp_wait=wait)
             for r in range(2) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "ddp", steps)])
    assert analysis.step.primary.kind is kind
    for metrics in analysis.ranks:
        assert metrics.communication == pytest.approx(wait)
        assert metrics.communication_bytes == 2 * BUCKET_BYTES
        assert metrics.backward == pytest.approx(0.008 - wait)  # the wait is taken out of backward
    if kind is StepKind.COMMUNICATION_BOUND:
        assert analysis.step.primary.severity is Severity.CRITICAL
    else:
        assert all(f.kind is not StepKind.COMMUNICATION_BOUND for f in analysis.step.issues)
