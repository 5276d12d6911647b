"""Work per step in the analysis: throughput, time per sample, and advice that fits the loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.advice import GENERIC_INPUT_ADVICE, input_bound_advice
from traceml_otel.analyze.kinds import Clock, StepKind
from traceml_otel.analyze.run_model import RankHost
from traceml_otel.report import render, report_json


def test_throughput_is_summed_over_ranks_and_shown_beside_step_time(tmp_path: Path) -> None:
    steps = [
        SyntheticStep(rank=r, step=n, world_size=2, samples=32, tokens=4096, forward=0.004, backward=0.008,
                      optimizer=0.001, residual=0.0005, input_wait=0.0005)
        for r in range(2) for n in range(40)
    ]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    step_time = 0.0005 + 0.004 + 0.008 + 0.001 + 0.0005
    work = analysis.throughput
    assert work.samples_per_step == 64 and work.samples_per_s == pytest.approx(64 / step_time, rel=1e-3)
    assert work.time_per_sample_s == pytest.approx(step_time / 64, rel=1e-3)
    assert work.tokens_per_s == pytest.approx(8192 / step_time, rel=1e-3)
    text = " ".join(render(analysis, "text").split())
    assert "Throughput 4,571 samples/s (64 samples per step; 219 us per sample)" in text
    report = report_json(analysis)
    assert report["ranks"][0]["samples_per_step"] == 32
    assert report["throughput"]["samples_per_step"] == 64
    assert report["run"]["service"] == "traceml-synthetic"  # from the spans' resource


def test_one_step_without_a_count_does_not_void_the_throughput(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, samples=None if n == 29 else 16) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert analysis.throughput.samples_per_step == 16 and analysis.throughput.samples_per_s is not None
    assert "samples counted on 29 of 30" in render(analysis, "text")


def test_work_counted_on_few_steps_is_not_a_throughput_and_says_why(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, samples=16 if n < 5 else None) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert analysis.throughput.samples_per_s is None
    text = render(analysis, "text")
    assert "samples counted on 5 of 30 steps; 1 rank counted them on fewer than half" in text
    none = [SyntheticStep(rank=0, step=n) for n in range(30)]
    text = render(analyze_path([write_run(tmp_path / "none", "r", none)]), "text")
    assert "no DataLoader was seen" in text


def _input_bound(tmp_path: Path, cpus: int, **loader: object) -> str:
    steps = [SyntheticStep(rank=0, step=n, input_wait=0.02, **(loader if n == 0 else {})) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps, cpus=cpus)])
    assert analysis.step.primary.kind is StepKind.INPUT_BOUND
    return analysis.step.primary.next


def test_input_bound_advice_with_workers_on_every_cpu_does_not_ask_for_more(tmp_path: Path) -> None:
    advice = _input_bound(tmp_path, num_workers=2, cpus=2, persistent_workers=True, prefetch_factor=4)
    assert "more workers" not in advice and "set num_workers" not in advice
    assert "num_workers=2 for 2 CPUs" in advice and "CPUs are the limit" in advice


def test_input_bound_advice_for_a_loader_without_workers(tmp_path: Path) -> None:
    advice = _input_bound(tmp_path, num_workers=0, cpus=8)
    assert "num_workers=0 for 8 CPUs" in advice
    assert "Load in worker processes: set num_workers to between 2 and 7 here" in advice
    assert "persistent_workers" not in advice  # no workers to keep


def test_input_bound_advice_names_each_setting_that_is_off() -> None:
    host = RankHost(0, cpus=16, num_workers=2, pin_memory=False, persistent_workers=False, prefetch_factor=2,
                    batch_size=32)
    advice = input_bound_advice([host], Clock.GPU)
    for expected in ("Try more workers (up to about 15)", "persistent_workers=True",
                     "prefetch_factor (now 2)", "pin_memory=True"):
        assert expected in advice
    assert "pin_memory" not in input_bound_advice([host], Clock.CPU)  # no device to pin for
    assert input_bound_advice([RankHost(0, cpus=4)], Clock.CPU) == GENERIC_INPUT_ADVICE


def test_loader_with_a_worker_per_cpu_gets_no_more_workers_advice(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parent / "scripts" / "saturated_loader.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", str(script), "--steps", "30"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    cpus = len(os.sched_getaffinity(0))
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["input_pipeline"] == [{"rank": 0, "cpus": cpus, "num_workers": cpus, "pin_memory": False,
                                         "persistent_workers": True, "prefetch_factor": 4, "batch_size": 8,
                                         "dataset": "SlowDataset"}]
    assert report["primary_diagnosis"]["kind"] == "INPUT_BOUND", report["primary_diagnosis"]
    advice = report["primary_diagnosis"]["next"]
    assert "more workers" not in advice and "set num_workers" not in advice, advice
    assert f"num_workers={cpus} for {cpus} CPU" in advice
    assert report["throughput"]["samples_per_step"] == 8


def test_worker_advice_on_a_two_cpu_machine_names_one_worker(tmp_path: Path) -> None:
    advice = _input_bound(tmp_path, num_workers=0, cpus=2)
    assert "set num_workers=1 (one CPU loads, the other trains)" in advice and "up to about" not in advice


def test_input_bound_advice_for_data_already_in_memory_says_nothing_of_files(tmp_path: Path) -> None:
    advice = _input_bound(tmp_path, num_workers=0, cpus=8, dataset="TensorDataset")
    assert "already in memory (TensorDataset)" in advice and "fetch whole batches" in advice
    assert "image library" not in advice and "storage" not in advice
    files = _input_bound(tmp_path / "files", num_workers=0, cpus=8, dataset="ImageFolder")
    assert "image library" in files
