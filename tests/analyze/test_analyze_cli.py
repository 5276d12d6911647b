"""``traceml analyze`` and the end-of-run diagnosis as the CLI calls them."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.cli.analyze import add_analyze_arguments, diagnose_run_directory, run_analyze


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_analyze_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    steps = [SyntheticStep(rank=0, step=n, input_wait=0.02 if n >= 30 else 0.001) for n in range(50)]
    return write_run(tmp_path / "run-a", "run-a", steps)


def test_diagnose_run_directory_writes_the_reports(run_dir: Path) -> None:
    text = diagnose_run_directory(run_dir, html=True)
    assert text.startswith("traceml-otel diagnosis  run run-a")
    assert f"Report: {run_dir / 'report.json'}" in text and f"Report: {run_dir / 'report.html'}" in text
    report = json.loads((run_dir / "report.json").read_text())
    assert report["primary_diagnosis"]["kind"] == "INPUT_BOUND"
    assert report["run"]["command"] == "python synthetic.py" and report["run"]["exit_code"] == 0
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_diagnose_run_directory_without_spans(tmp_path: Path) -> None:
    assert diagnose_run_directory(tmp_path).startswith("traceml: no diagnosis:")


def test_analyze_formats_windows_and_output(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "report.json"
    assert run_analyze(args(str(run_dir), "--format", "json", "-o", str(out), "--window", "20")) == 0
    report = json.loads(out.read_text())
    assert report["window"] == {
        "mode": "last",
        "first_step": 30,
        "last_step": 49,
        "steps": 20,
        "requested": "last 20 steps",
        "left_out_steps": 0,
        "startup_steps": 0,  # a window of the last steps has no start-up
        "startup_last_step": None,
        "startup_s": 0.0,
    }
    assert report["primary_diagnosis"]["kind"] == "INPUT_BOUND"
    assert run_analyze(args(str(run_dir), "--step-range", "0:29")) == 0
    text = capsys.readouterr().out
    assert "Verdict    BALANCED" in text and "30 aligned steps (steps 0-29, steps 0:29)" in text


def test_analyze_reads_explicit_files(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_analyze(args(str(run_dir / "rank-0.traces.jsonl"), "--format", "html")) == 0
    assert "<svg" in capsys.readouterr().out


def test_analyze_errors_and_no_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_analyze(args()) == 2
    assert "nothing to analyse" in capsys.readouterr().err
    assert run_analyze(args(str(tmp_path / "missing"))) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"resourceSpans": []}\n')
    assert run_analyze(args(str(empty))) == 1
    assert "NO DATA" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        args("--tempo", "http://a", "--jaeger", "http://b")


def test_the_traceml_command_wires_analyze_and_compare(run_dir: Path) -> None:
    analyze = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert analyze.returncode == 0, analyze.stderr
    assert json.loads(analyze.stdout)["primary_diagnosis"]["kind"] == "INPUT_BOUND"
    compare = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "compare", str(run_dir), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert compare.returncode == 0 and "REGRESSION" not in compare.stdout  # a run against itself
    assert "+0.0 %" in compare.stdout and ("EQUIVALENT" in compare.stdout or "INCONCLUSIVE" in compare.stdout)


def test_public_names_of_the_analyze_package() -> None:
    import traceml_otel.analyze as analyze

    assert sorted(analyze.__all__) == [
        "Clock",
        "Finding",
        "MemoryKind",
        "RunAnalysis",
        "Severity",
        "SourceError",
        "StepKind",
        "StepTiming",
        "WindowSpec",
        "analyze_path",
        "analyze_run",
        "analyze_source",
    ]
    assert all(
        callable(getattr(analyze, name)) or isinstance(getattr(analyze, name), type)
        for name in analyze.__all__
    )
