"""The compare policy at its thresholds, and the compare command on runs and reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze.compare_policy import compare_runs
from traceml_otel.analyze.compare_summary import RunSummary
from traceml_otel.cli.compare import add_compare_arguments, run_compare
from traceml_otel.report.run_summary import ReportFormatError, summary_from_report

PHASES = (
    ("input_wait", 0.001),
    ("h2d", 0.0),
    ("forward", 0.004),
    ("backward", 0.008),
    ("optimizer", 0.001),
    ("residual", 0.0005),
)


def summary(
    step_time: float = 0.1,
    *,
    kind: str = "BALANCED",
    severity: str = "info",
    clock: str = "cpu",
    memory: int | None = None,
    forward: float = 0.004,
) -> RunSummary:
    phases = tuple((name, forward if name == "forward" else value) for name, value in PHASES)
    return RunSummary("x", "run", kind, severity, clock, 100, step_time, phases, memory)


@pytest.mark.parametrize(
    ("after", "verdict", "material"),
    [
        (0.1029, "EQUIVALENT", False),
        (0.103, "REGRESSION", False),
        (0.108, "REGRESSION", True),
        (0.0971, "EQUIVALENT", False),
        (0.097, "IMPROVEMENT", False),
        (0.092, "IMPROVEMENT", True),
    ],
)
def test_step_time_policy(after: float, verdict: str, material: bool) -> None:
    comparison = compare_runs(summary(0.1), summary(after))
    assert (comparison.verdict, comparison.material) == (verdict, material)


def test_the_policy_reads_its_thresholds_from_the_thresholds_module(monkeypatch) -> None:
    from traceml_otel.analyze import thresholds

    assert compare_runs(summary(0.1), summary(0.104)).verdict == "REGRESSION"
    monkeypatch.setattr(thresholds, "COMPARE_TIME_CHANGE", 0.05)
    monkeypatch.setattr(thresholds, "COMPARE_MEMORY_CHANGE", 0.5)
    assert compare_runs(summary(0.1), summary(0.104)).verdict == "EQUIVALENT"
    assert compare_runs(summary(memory=100 << 20), summary(memory=140 << 20)).verdict == "EQUIVALENT"


@pytest.mark.parametrize(
    ("after", "verdict"), [(109, "EQUIVALENT"), (110, "REGRESSION"), (90, "IMPROVEMENT")]
)
def test_memory_policy(after: int, verdict: str) -> None:
    comparison = compare_runs(summary(memory=100 << 20), summary(memory=after << 20))
    assert comparison.verdict == verdict


def test_a_worse_diagnosis_is_a_regression_even_at_equal_speed() -> None:
    worse = compare_runs(summary(), summary(kind="INPUT_BOUND", severity="warning"))
    assert worse.verdict == "REGRESSION" and worse.diagnosis == "regression"
    better = compare_runs(summary(kind="RESIDUAL_HEAVY", severity="critical"), summary(kind="COMPUTE_BOUND"))
    assert better.verdict == "IMPROVEMENT"
    unknown = compare_runs(summary(kind="INCOMPLETE_DATA"), summary())
    assert unknown.diagnosis == "not compared" and unknown.verdict == "EQUIVALENT"


def test_any_regression_beats_an_improvement() -> None:
    comparison = compare_runs(summary(0.1, memory=100), summary(0.09, memory=200))
    assert comparison.verdict == "REGRESSION"


def test_phases_only_on_the_same_clock() -> None:
    same = compare_runs(summary(), summary(forward=0.005))
    forward = next(p for p in same.phases if p.name == "forward")
    assert forward.verdict == "regression" and forward.change == pytest.approx(0.25)
    other = compare_runs(summary(), summary(clock="gpu"))
    assert other.phases == () and any("different clocks" in note for note in other.notes)


def test_report_loader_rejects_foreign_and_newer_reports() -> None:
    with pytest.raises(ReportFormatError):
        summary_from_report({"schema": "something else"}, "a")
    with pytest.raises(ReportFormatError, match="newer"):
        summary_from_report({"schema": "traceml-otel/report", "schema_version": 99}, "a")


def compare_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_compare_arguments(parser)
    return parser.parse_args(list(argv))


def test_compare_command_on_a_run_and_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "a", "a", [SyntheticStep(rank=0, step=n) for n in range(40)])
    slow = write_run(tmp_path / "b", "b", [SyntheticStep(rank=0, step=n, forward=0.006) for n in range(40)])
    out = tmp_path / "a.json"
    from traceml_otel.cli.analyze import diagnose_run_directory

    diagnose_run_directory(base)
    out.write_text((base / "report.json").read_text())
    assert run_compare(compare_args(str(out), str(slow), "--format", "json")) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "REGRESSION" and document["material"] is True
    assert document["step_time"]["change"] == pytest.approx(0.002 / 0.0145, rel=1e-3)
    assert run_compare(compare_args(str(slow), str(base), "--fail-on-regression")) == 0
    text = capsys.readouterr().out
    assert "Verdict      IMPROVEMENT (material)" in text
    assert run_compare(compare_args(str(base), str(slow), "--fail-on-regression")) == 1
    assert run_compare(compare_args(str(base), str(tmp_path / "missing"))) == 2


def test_a_fresh_analysis_and_its_stored_report_give_the_same_summary(tmp_path: Path) -> None:
    """``compare`` reads a fresh run from its analysis and an old one from its ``report.json``: both
    readings of the same run agree field by field, so neither can drift from the other."""
    from traceml_otel.analyze.compare_summary import summary_of
    from traceml_otel.analyze.pipeline import analyze_path
    from traceml_otel.report import render

    gpu = [SyntheticStep(rank=r, step=n, gpu=True, peak_allocated=(3 + r) << 30,
                         peak_reserved=None if r else 5 << 30, memory_total=80 << 30, samples=32,
                         input_wait=0.02 if n > 20 else 0.001)
           for r in (0, 1) for n in range(40)]
    cpu = [SyntheticStep(rank=0, step=n, backward=0.03 if n % 7 else 0.2) for n in range(40)]
    for name, steps in (("gpu", gpu), ("cpu", cpu)):
        analysis = analyze_path([write_run(tmp_path / name, name, steps)])
        fresh = summary_of(analysis, name)
        stored = summary_from_report(json.loads(render(analysis, "json")), name)
        assert fresh == stored
        assert fresh.step_time is not None and fresh.steps > 0
    assert fresh.peak_memory is None  # the CPU run
    assert summary_of(analyze_path([tmp_path / "gpu"]), "g").peak_memory == 5 << 30  # rank 0's reserved
