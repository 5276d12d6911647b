"""The columnar engine reads skipped updates and input wait inside the step as the span reader does:
real runs (a GradScaler skipping every 5th update, in both modes; Lightning accumulation with its
second batch fetched inside the step) analysed by both engines give the same report, the counts of
skipped updates and the INPUT_BOUND verdict included."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.analyze.test_columnar import _assert_same, in_time_removed
from tests.tools import import_or_missing
from tests.verdicts.runner import traceml_run
from traceml_otel.analyze import analyze_path
from traceml_otel.report import render


@pytest.fixture(autouse=True)
def _duckdb() -> None:
    if importlib.util.find_spec("duckdb") is None:
        if os.environ.get("CI"):
            pytest.fail("duckdb is not installed: CI must run the columnar tests", pytrace=False)
        pytest.skip("duckdb is not installed")


VERDICT_KEYS = ("primary_diagnosis", "issues", "abstentions", "severity_caps")
"""What the span reader takes from its reference segment when it split the run (the columnar engine
computes no segments yet, docs/analyzer.md): compared only when the run is one segment."""


def _report(run_dir: Path, engine: str) -> tuple[dict, int]:
    report = json.loads(render(analyze_path([run_dir], engine=engine), "json"))
    report.pop("generated_at", None)
    report["run"].pop("source", None)
    segments = len((report.get("segments") or {}).get("segments") or [])
    return in_time_removed(report), segments


def _both_engines(run_dir: Path) -> dict:
    (python, segments), (columnar, _) = _report(run_dir, "python"), _report(run_dir, "columnar")
    if segments > 1:  # a short loop on a loaded machine may split: its verdict is its steady segment's
        for key in VERDICT_KEYS:
            python.pop(key, None)
            columnar.pop(key, None)
    _assert_same(python, columnar)
    return columnar


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_skipped_updates_read_alike_by_both_engines(tmp_path: Path, mode: str) -> None:
    run = traceml_run(tmp_path, "scaler_skips.py", "--steps", "100",
                      *(("--explicit",) if mode == "explicit" else ()))
    report = _both_engines(run.run_dir)
    accumulation = report["accumulation"]
    assert accumulation["skipped_updates"] == 20 and accumulation["micro_steps"] == 0, accumulation
    startup = report["window"]["startup_steps"]  # a first step 10x the others leaves the window (not a skip)
    assert startup <= 4 and accumulation["optimizer_updates"] == 80 - startup, accumulation


def test_input_wait_inside_the_step_read_alike_by_both_engines(tmp_path: Path) -> None:
    import_or_missing("lightning")
    run = traceml_run(tmp_path, "lightning_accumulate.py", "--updates", "30")
    report = _both_engines(run.run_dir)
    assert report["primary_diagnosis"]["kind"] == "INPUT_BOUND", report["primary_diagnosis"]
    wait = next(p["share"] for p in report["phases"] if p["name"] == "input_wait")
    assert wait > 0.4, report["phases"]  # the in-step batch's fetch is input wait in the columns too
