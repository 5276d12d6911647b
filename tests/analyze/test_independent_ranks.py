"""Independent processes are compared, never diagnosed as stragglers waiting in collectives."""

from __future__ import annotations

from tests.analyze.test_analyze_rules import rank
from traceml_otel.analyze.kinds import Clock, Severity, StepKind
from traceml_otel.analyze.rules import diagnose_step_time

STRAGGLER_KINDS = {StepKind.STRAGGLER, StepKind.INPUT_STRAGGLER, StepKind.H2D_STRAGGLER,
                   StepKind.COMPUTE_STRAGGLER}


def _uneven_pair():
    """Rank 1 is 30 % slower in backward: under DDP this reads as rank 0 arriving last."""
    return [rank(0, backward=0.6, residual=0.05), rank(1, backward=0.9, residual=0.05)]


def test_uneven_independent_ranks_get_a_comparison_and_no_straggler() -> None:
    diagnosis = diagnose_step_time(_uneven_pair(), Clock.CPU, "independent")
    kinds = [f.kind for f in diagnosis.issues]
    assert not set(kinds) & STRAGGLER_KINDS
    (finding,) = [f for f in diagnosis.issues if f.kind is StepKind.INDEPENDENT_RANKS]
    assert finding.severity is Severity.INFO and "collective" not in finding.why
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["slowest_rank"] == 1 and 0.10 <= evidence["step_time_excess"] < 0.3
    assert "in backward" in finding.why


def test_the_same_numbers_under_ddp_still_name_a_straggler() -> None:
    diagnosis = diagnose_step_time(_uneven_pair(), Clock.CPU, "ddp")
    assert diagnosis.primary.kind in STRAGGLER_KINDS
    assert not [f for f in diagnosis.issues if f.kind is StepKind.INDEPENDENT_RANKS]


def test_even_independent_ranks_say_nothing_extra() -> None:
    pair = [rank(0), rank(1, backward=0.62)]
    diagnosis = diagnose_step_time(pair, Clock.CPU, "independent")
    assert not [f for f in diagnosis.issues if f.kind is StepKind.INDEPENDENT_RANKS]
    assert diagnosis.primary.kind in {StepKind.COMPUTE_BOUND, StepKind.BALANCED}
