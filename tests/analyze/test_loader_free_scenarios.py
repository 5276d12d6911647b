"""Loops without a DataLoader earn a verdict, not INCOMPLETE_DATA (examples/diagnosis, through
``traceml run``): pre-loaded tensors (COMPUTE_BOUND), a slow generator in a loop with no traceml line
(BETWEEN_STEPS; INPUT_BOUND once wrapped), and a 2-rank DDP job on pre-loaded tensors
(COMMUNICATION_BOUND)."""

from __future__ import annotations

from pathlib import Path

from tests.analyze.test_diagnosis_scenarios import launch, primary


def test_preloaded_tensors_are_judged_on_traced_time(tmp_path: Path) -> None:
    report, _, stdout = launch(tmp_path, "preloaded_compute.py", steps=25)
    assert primary(report) == "COMPUTE_BOUND", report["primary_diagnosis"]
    (rank,) = report["ranks"]
    assert rank["input_wait_s"] is None and rank["between_steps_s"] is not None  # no fetch, gaps recorded
    assert report["run"]["step_sources"] == ["trace_step"]
    assert "steps found by: trace_step blocks" in stdout


def test_slow_generator_in_a_plain_loop_is_time_between_steps(tmp_path: Path) -> None:
    report, _, stdout = launch(tmp_path, "slow_generator.py", steps=20)
    assert primary(report) == "BETWEEN_STEPS", report["primary_diagnosis"]
    assert "not measured as input wait" in report["primary_diagnosis"]["why"]
    assert report["run"]["step_sources"] == ["inferred"]  # the script has no traceml line
    assert report["window"]["steps"] == 20  # every step inferred; a first step 10x the others (start-up,
    # as under a loaded CI machine) leaves the means, not the count
    assert report["ranks"][0]["steps"] == 20 - report["window"]["left_out_steps"]
    assert "steps found by: inference from the loop's own calls" in stdout


def test_slow_generator_wrapped_is_input_bound(tmp_path: Path) -> None:
    report, _, _ = launch(tmp_path, "slow_generator.py", steps=20, script_args=("--wrap",))
    assert primary(report) == "INPUT_BOUND", report["primary_diagnosis"]


def test_loader_free_ddp_dominated_by_all_reduce_is_communication_bound(tmp_path: Path) -> None:
    report, _, _ = launch(tmp_path, "loader_free_ddp.py", "--nproc-per-node", "2", steps=15)
    assert primary(report) == "COMMUNICATION_BOUND", report["primary_diagnosis"]
    assert all(r["input_wait_s"] is None for r in report["ranks"])
