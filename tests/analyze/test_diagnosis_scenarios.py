"""End to end through the launcher: each example in examples/diagnosis earns its diagnosis.

These run ``traceml run`` (``torch.distributed.run``, CPU, gloo) at small size, a few seconds
each, and read the ``report.json`` the run leaves behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "examples" / "diagnosis"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("traceml_otel._api") is None,
    reason="the capture side (traceml.init) is not installed",
)


def traceml_run(tmp_path: Path, script: str, *launcher: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", PYTHONPATH=path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceml_otel.cli",
            "run",
            str(SCENARIOS / script),
            *launcher,
            "--",
            "--steps",
            str(steps),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Verdict" in result.stdout  # traceml run prints the diagnosis
    (run_dir,) = (tmp_path / "runs").iterdir()
    return json.loads((run_dir / "report.json").read_text())


def primary(report: dict) -> str:
    return report["primary_diagnosis"]["kind"]


def test_slow_dataset_is_input_bound(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "input_bound.py", steps=30)
    assert primary(report) == "INPUT_BOUND"


def test_big_model_with_ready_batches_is_compute_bound(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "compute_bound.py", steps=25)
    assert primary(report) == "COMPUTE_BOUND"


def test_work_outside_the_phases_is_residual_heavy(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "residual_heavy.py", steps=30)
    assert primary(report) == "RESIDUAL_HEAVY"


def test_slow_input_on_one_of_two_ranks_is_an_input_straggler(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "input_straggler.py", "--nproc-per-node", "2", steps=30)
    assert primary(report) == "INPUT_STRAGGLER"
    evidence = {e["name"]: e["value"] for e in report["primary_diagnosis"]["evidence"]}
    assert evidence["culprit_rank"] == 1 and report["run"]["world_size"] == 2


def test_bypassed_forward_is_incomplete_data(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "incomplete_data.py", steps=30)
    assert primary(report) == "INCOMPLETE_DATA"
    missing = {m["signal"] for a in report["abstentions"] for m in a["missing"]}
    assert missing == {"forward"}


def test_healthy_small_run_is_not_blamed_on_tracing_overhead(tmp_path: Path) -> None:
    report = traceml_run(tmp_path, "healthy_tiny.py", steps=100)
    assert primary(report) in {"COMPUTE_BOUND", "BALANCED"}, report["primary_diagnosis"]["why"]
    shares = {p["name"]: p["share"] for p in report["phases"]}
    assert shares["residual"] < 0.10 and shares["input_wait"] < 0.10
