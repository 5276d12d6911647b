"""The rank whose own process raised is the rank RUN_FAILED names (issue 21): a DataLoader error on
rank 1 outside ``trace_step`` makes rank 0 fail in its next collective; rank 1 is named, not rank 0."""

from __future__ import annotations

from pathlib import Path

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel import contract as c
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.wire.export_stats import ExportStats, encode_export_stats


def _run(tmp_path: Path, *, rank1_status: str) -> Path:
    steps = [SyntheticStep(rank=r, step=n, world_size=2) for r in (0, 1) for n in range(30)]
    steps.append(SyntheticStep(rank=0, step=30, world_size=2, error="RuntimeError"))
    run_dir = write_run(tmp_path / "run-x", "run-x", steps)
    for rank, status in ((0, "exception RuntimeError"), (1, rank1_status)):
        stats = ExportStats(run_id="run-x", rank=rank, steps_received=30, steps_local=30, final=True,
                            steps_traced=31 - rank, local_copy_complete=True, end_status=status,
                            clean_shutdown=True)
        (run_dir / c.export_stats_file_name(rank)).write_text(encode_export_stats(stats))
    return run_dir


def _run_failed(run_dir: Path):
    analysis = analyze_path([run_dir])
    (finding,) = [f for f in analysis.run_findings if f.kind.name == "RUN_FAILED"]
    return finding


def test_a_rank_that_raised_outside_a_step_is_named_not_the_rank_that_failed_after(tmp_path: Path) -> None:
    finding = _run_failed(_run(tmp_path, rank1_status="exception RuntimeError"))
    assert finding.title == "The run failed: rank 1 raised RuntimeError outside a step"
    assert finding.why.startswith("Rank 1 raised RuntimeError outside trace_step() after its step 29")
    assert "rank 0 then raised RuntimeError in step 30 (likely a consequence)" in finding.why
    assert {e.name: e.value for e in finding.evidence}["failed_rank"] == 1


def test_without_an_outside_exception_the_failed_step_is_named(tmp_path: Path) -> None:
    finding = _run_failed(_run(tmp_path, rank1_status="SIGTERM"))
    assert finding.why.startswith("Rank 0 raised RuntimeError in step 30")


def test_a_rank_that_crashed_in_a_native_abort_is_named_not_the_rank_that_lost_it(tmp_path: Path) -> None:
    """gloo on one extra all_reduce of another size mid-training (measured, docs/hangs.md): the rank
    with the extra call aborts (SIGABRT, 'Received data size doesn't match expected size'); the other
    raises RuntimeError (connection reset) in its DDP all-reduce; the job exits 134."""
    from tests.synthetic_runs import write_manifest_of

    run_dir = _run(tmp_path, rank1_status="trainer exited without shutdown (killed?)")
    write_manifest_of(run_dir, "run-x", 2, exit_code=134)
    finding = _run_failed(run_dir)
    assert finding.title == "The run failed: rank 1 crashed (SIGABRT)"
    assert "rank 0 then raised RuntimeError in step 30 (likely a consequence)" in finding.why
    assert {e.name: e.value for e in finding.evidence}["failed_rank"] == 1
    write_manifest_of(run_dir, "run-x", 2, exit_code=137)  # a scheduler's SIGKILL is no crash of rank 1
    assert _run_failed(run_dir).why.startswith("Rank 0 raised RuntimeError in step 30")


def test_when_the_rank_with_the_correct_call_aborts_the_failed_step_with_an_extra_call_is_named() -> None:
    """gloo with an extra all_reduce larger than DDP's bucket (measured, docs/hangs.md): rank 0 (the
    correct call) receives the larger message and aborts; rank 1 raises in the step of its extra call,
    which moved more bytes than any of its completed steps."""
    from traceml_otel.analyze.evidence import run_findings, step_failures
    from traceml_otel.analyze.findings import RankCount
    from traceml_otel.analyze.run_model import StepTiming

    steps = [StepTiming("r", rank, n, comm_calls=1, comm_bytes=36) for rank in (0, 1) for n in range(3)]
    steps.append(StepTiming("r", 1, 3, comm_calls=1, comm_bytes=400, error="RuntimeError"))
    stats = [ExportStats(run_id="r", rank=0, end_status="trainer exited without shutdown (killed?)"),
             ExportStats(run_id="r", rank=1, end_status="exception RuntimeError")]
    failures = step_failures(steps)
    counts = [RankCount(0, 3, 0, 2), RankCount(1, 4, 0, 3)]
    def failed(with_steps: list[StepTiming]):
        findings = run_findings(world_size=2, counts=counts, failures=failures, failed_steps=1, exit_code=134,
                                export_stats=stats, steps=with_steps)
        (finding,) = [f for f in findings if f.kind.name == "RUN_FAILED"]
        return finding

    finding = failed(steps)
    assert finding.title == ("The run failed: collective mismatch, rank 1 made an extra collective call in "
                             "step 3 (rank 0 crashed, SIGABRT)")
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["failed_rank"] == 1 and evidence["crashed_rank"] == 0
    usual = [s._replace(comm_bytes=36) for s in steps]  # the failed step moved no more than usual
    assert failed(usual).title == "The run failed: rank 0 crashed (SIGABRT)"


def test_of_two_ranks_that_ended_without_shutdown_the_first_to_end_is_the_crash() -> None:
    """gloo aborts rank 1 (SIGABRT); the launcher then stops rank 0, which is blocked in the collective
    and cannot run its shutdown before the SIGKILL: it ended without shutting down too, seconds later."""
    from traceml_otel.analyze.evidence import run_findings
    from traceml_otel.analyze.findings import RankCount

    def stats(rank: int, closed: float | None) -> ExportStats:
        return ExportStats(run_id="r", rank=rank, end_status="trainer exited without shutdown (killed?)",
                           local_copy_closed_unix=closed)

    def title(export_stats: list[ExportStats]) -> str:
        counts = [RankCount(0, 3, 0, 2), RankCount(1, 3, 0, 2)]
        findings = run_findings(world_size=2, counts=counts, failures=[], failed_steps=0, exit_code=134,
                                export_stats=export_stats, steps=[])
        (finding,) = [f for f in findings if f.kind.name == "RUN_FAILED"]
        return finding.title

    assert title([stats(0, 1_000.0 + 5.2), stats(1, 1_000.0)]) == "The run failed: rank 1 crashed (SIGABRT)"
    assert title([stats(0, 1_000.0), stats(1, 1_000.0 + 5.2)]) == "The run failed: rank 0 crashed (SIGABRT)"
    assert title([stats(0, None), stats(1, 1_000.0)]) == "The run failed: rank 1 crashed (SIGABRT)"
    assert title([stats(0, None), stats(1, None)]) == "The run failed: rank 0 crashed (SIGABRT)"  # by rank
