"""How a run ended, read from the metric series (``analyze --prometheus``): the rank named as the
failure is the one ``traceml run`` saw fail first, whatever the other ranks' ends say."""

from __future__ import annotations

from traceml_otel.analyze.kinds import RunKind
from traceml_otel.analyze.metric_ends import end_findings
from traceml_otel.analyze.sources.prometheus_ends import RankExit, RunEnds


def _failure(ends: RunEnds) -> dict[str, object]:
    (finding,) = [f for f in end_findings(ends) if f.kind == RunKind.RUN_FAILED]
    return {e.name: e.value for e in finding.evidence}


def test_the_launchers_first_failure_is_named_before_a_lower_rank_that_failed_after_it() -> None:
    ends = RunEnds(exits=(RankExit(0, "exception", "RuntimeError"), RankExit(1, "exception", "ValueError")),
                   first_failure=(1, "exitcode 1"))
    assert _failure(ends) == {"failed_rank": 1, "exception_type": "ValueError"}


def test_the_launchers_first_failure_is_named_before_a_lower_rank_that_went_silent() -> None:
    ends = RunEnds(exits=(RankExit(1, "exception", "ValueError"),), vanished=(0,),
                   first_failure=(1, "exitcode 1"))
    evidence = _failure(ends)
    assert evidence == {"failed_rank": 1, "exception_type": "ValueError"}
    finding = next(f for f in end_findings(ends) if f.kind == RunKind.RUN_FAILED)
    assert "rank 0 ended or went silent after it" in finding.why


def test_a_killed_rank_that_said_nothing_is_named_from_the_launchers_view() -> None:
    ends = RunEnds(exits=(RankExit(0, "exception", "DistBackendError"),), vanished=(1,),
                   first_failure=(1, "SIGKILL"))
    assert _failure(ends) == {"failed_rank": 1, "exception_type": "SIGKILL"}


def test_without_the_launchers_view_a_silent_rank_comes_first_then_the_lowest_failed_rank() -> None:
    assert _failure(RunEnds(exits=(RankExit(0, "exception", "RuntimeError"),), vanished=(3,))) == {
        "failed_rank": 3, "vanished_ranks": "[3]"}
    two = RunEnds(exits=(RankExit(2, "exception", "ValueError"), RankExit(5, "signal", "SIGSEGV")))
    assert _failure(two) == {"failed_rank": 2, "exception_type": "ValueError"}


def test_a_survivor_stopped_by_sigterm_is_not_a_failure() -> None:
    ends = RunEnds(exits=(RankExit(0, "signal", "SIGTERM"), RankExit(1, "exception", "ValueError")),
                   first_failure=(1, "exitcode 1"))
    assert _failure(ends) == {"failed_rank": 1, "exception_type": "ValueError"}
    assert [f.kind for f in end_findings(RunEnds(exits=(RankExit(0, "signal", "SIGTERM"),)))] == [
        RunKind.RUN_INTERRUPTED]
