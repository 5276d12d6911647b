"""Steps a deep capture profiled are left out of the per-step means: the profiler slows them, and our own
capture must never make a straggler (or any verdict) of the rank it ran on."""

from __future__ import annotations

from pathlib import Path

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.wire.capture_record import CaptureSummary, write_summary

CAPTURED = (40, 41, 42)


def _steps() -> list[SyntheticStep]:
    """Two DDP ranks, balanced; in steps 40-42 rank 0 runs 100x slower (the profiler's cost) and rank 1
    waits for it in backward's gradient all-reduce."""
    steps = []
    for rank in range(2):
        for number in range(80):
            slow = number in CAPTURED
            steps.append(SyntheticStep(
                rank=rank, step=number, world_size=2, parallelism="ddp",
                forward=0.5 if slow and rank == 0 else 0.004,
                backward=0.504 if slow and rank == 1 else 0.008,
                ddp_wait=0.496 if slow and rank == 1 else 0.0005,
            ))
    return steps


def _kinds(run_dir: Path) -> list[str]:
    analysis = analyze_path([run_dir], engine="python")
    return [analysis.step.primary.kind, *(i.kind for i in analysis.step.issues)]


def test_a_capture_never_makes_its_rank_a_straggler(tmp_path: Path) -> None:
    plain = write_run(tmp_path / "plain", "run-plain", _steps())
    assert any("STRAGGLER" in str(kind) for kind in _kinds(plain))  # the slow steps alone make one
    captured = write_run(tmp_path / "captured", "run-captured", _steps())
    write_summary(captured, CaptureSummary("run-captured", 0, 1, "spike", steps=CAPTURED))
    assert not any("STRAGGLER" in str(kind) for kind in _kinds(captured)), _kinds(captured)
    assert analyze_path([captured], engine="python").captures.captures  # and the capture is still reported


def test_one_rank_leaves_captured_steps_out_of_its_means_and_says_how_many(tmp_path: Path) -> None:
    """One rank: a capture's 100x slower steps (and the step before and after) leave the means, so a
    compare of two identical runs is not moved by one run's capture; ``left_out_steps`` counts them."""
    steps = [SyntheticStep(rank=0, step=n, forward=0.5 if n in CAPTURED else 0.004, backward=0.008)
             for n in range(80)]
    plain = analyze_path([write_run(tmp_path / "plain", "run-plain", steps)], engine="python")
    run_dir = write_run(tmp_path / "captured", "run-captured", steps)
    write_summary(run_dir, CaptureSummary("run-captured", 0, 1, "spike", steps=CAPTURED))
    captured = analyze_path([run_dir], engine="python")
    assert plain.window.left_out_steps == 0 and plain.ranks[0].steps == 80
    assert captured.window.left_out_steps == len(CAPTURED) + 2  # with the step before and after
    assert captured.ranks[0].steps == 80 - captured.window.left_out_steps
    assert captured.ranks[0].forward is not None and plain.ranks[0].forward is not None
    assert captured.ranks[0].forward < 0.005 < plain.ranks[0].forward  # 4 ms, not 4 + 1.5 s / 80
    columnar = analyze_path([run_dir], engine="columnar")
    assert columnar.window.left_out_steps == captured.window.left_out_steps
    assert columnar.ranks[0].steps == captured.ranks[0].steps


def _columnar_kinds(run_dir: Path) -> list[str]:
    analysis = analyze_path([run_dir], engine="columnar")
    return [analysis.step.primary.kind, *(i.kind for i in analysis.step.issues)]


def test_the_columnar_engine_leaves_the_profiled_steps_out_too(tmp_path: Path) -> None:
    plain = write_run(tmp_path / "plain", "run-plain", _steps())
    assert any("STRAGGLER" in str(kind) for kind in _columnar_kinds(plain))
    captured = write_run(tmp_path / "captured", "run-captured", _steps())
    write_summary(captured, CaptureSummary("run-captured", 0, 1, "spike", steps=CAPTURED))
    assert not any("STRAGGLER" in str(kind) for kind in _columnar_kinds(captured)), _columnar_kinds(captured)
    assert _columnar_kinds(captured) == _kinds(captured)  # both engines agree
    analysis = analyze_path([captured], engine="columnar")
    assert analysis.captures.captures and analysis.window.steps == 80  # the window itself is the run's


def test_the_columnar_engine_leaves_out_the_steps_run_while_a_trace_was_written(tmp_path: Path) -> None:
    """The capture profiled steps 5-7 (fast ones); its export ran while steps 40-42 did: found in SQL."""
    run_dir = write_run(tmp_path / "exported", "run-exported", _steps())
    starts = {s.step: s.start_unix_nano / 1e9 for s in FileSpanSource([run_dir]).load().steps if s.rank == 0}
    start, written = starts[40], starts[42]  # from step 40's start into step 42
    write_summary(run_dir, CaptureSummary("run-exported", 0, 1, "spike", steps=(5, 6, 7),
                                          started_unix=start + 0.001, stopped_unix=start + 0.002,
                                          finished_unix=written + 0.001))
    assert not any("STRAGGLER" in str(kind) for kind in _columnar_kinds(run_dir)), _columnar_kinds(run_dir)
    assert _columnar_kinds(run_dir) == _kinds(run_dir)


def test_a_deferred_export_leaves_out_its_profiled_steps_only(tmp_path: Path) -> None:
    """The capture profiled steps 5-7; its export waited for the end of training (the cost budget): the
    steps between the profiling and the export ran beside no export and stay in, in both engines."""
    run_dir = write_run(tmp_path / "deferred", "run-deferred", _steps())
    starts = {s.step: s.start_unix_nano / 1e9 for s in FileSpanSource([run_dir]).load().steps if s.rank == 0}
    end = starts[79] + 1.0
    write_summary(run_dir, CaptureSummary("run-deferred", 0, 1, "residual", steps=(5, 6, 7),
                                          started_unix=starts[5] - 0.0001, stopped_unix=starts[7] + 0.001,
                                          export_began_unix=end, finished_unix=end + 0.2,
                                          export_deferred=True, export_after_training=True))
    for engine in ("python", "columnar"):
        analysis = analyze_path([run_dir], engine=engine)
        assert analysis.window.left_out_steps == 5, (engine, analysis.window.left_out_steps)  # 4-8
    assert any("STRAGGLER" in str(kind) for kind in _kinds(run_dir))  # steps 40-42 stay in
