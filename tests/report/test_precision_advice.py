"""Advice reads what was observed: a run already under autocast, or in half-precision weights, is never
told to try mixed precision (the other advice stands); an fp32 run still is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_otel.capture.precision import AutocastWatch, reduced_weights

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "report" / "scripts" / "autocast_compute.py"


def test_the_watch_sees_the_first_enabled_autocast_once_then_gives_torch_its_method_back() -> None:
    import torch
    from torch.amp import autocast_mode

    original = autocast_mode.autocast.__dict__["__enter__"]
    seen: list[str] = []
    watch = AutocastWatch(seen.append)
    assert watch.install()
    with torch.autocast("cpu", enabled=False):
        pass
    assert seen == [] and autocast_mode.autocast.__dict__["__enter__"] is not original
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")  # the region itself works as ever
    assert seen == ["autocast cpu bf16"]
    assert autocast_mode.autocast.__dict__["__enter__"] is original  # nothing of ours is left
    assert not watch.uninstall()


def test_half_precision_weights_are_seen() -> None:
    import torch

    assert reduced_weights(torch.nn.Linear(2, 2).to(torch.bfloat16)) == "bf16 weights"
    assert reduced_weights(torch.nn.Linear(2, 2).half()) == "fp16 weights"
    assert reduced_weights(torch.nn.Linear(2, 2)) == "" and reduced_weights(object()) == ""


@pytest.mark.parametrize(("flag", "precision"), [
    ("--autocast", "autocast cpu bf16"), ("--bf16", "bf16 weights"), ("--fp32", ""),
])
def test_the_compute_advice_reads_the_runs_precision(tmp_path: Path, flag: str, precision: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), TRACEML_LIVE="off")
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", str(SCRIPT), flag], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "rank-0.time.json").read_text())["precision"] == precision
    report = json.loads((run_dir / "report.json").read_text())
    findings = [report["primary_diagnosis"], *report.get("issues", [])]
    advice = " ".join(str(f.get("next", "")) for f in findings)
    if precision:
        assert "mixed precision" not in advice and "mixed precision" not in done.stdout
    compute = [f for f in findings if f.get("kind") == "COMPUTE_BOUND"]
    if compute:  # a big model on batches in memory is compute-bound unless the machine is busy
        expected = f"already in reduced precision ({precision})" if precision else "mixed precision"
        assert expected in compute[0]["next"]


def test_the_advice_for_a_run_in_reduced_precision_leaves_mixed_precision_out(tmp_path: Path) -> None:
    from tests.synthetic_runs import SyntheticStep, write_run
    from traceml_otel.analyze.advice import for_precision
    from traceml_otel.analyze.pipeline import analyze_path

    steps = [SyntheticStep(rank=0, step=n, input_wait=0.0001, forward=0.02, backward=0.04) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    primary = analysis.step.primary
    assert primary.kind.name == "COMPUTE_BOUND" and "mixed precision" in primary.next
    fitted = for_precision(analysis, "autocast cuda bf16")
    assert "mixed precision" not in fitted.step.primary.next
    assert "already in reduced precision (autocast cuda bf16)" in fitted.step.primary.next
    assert for_precision(analysis, "") is analysis
