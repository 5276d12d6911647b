"""Wording and charts that must not contradict the run: one rank, no collectives, a large change
that is not drift, the drift marker's label."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.communication_rules import calls_per_step
from traceml_otel.analyze.findings import DriftAnalysis, Throughput
from traceml_otel.analyze.kinds import DriftKind
from traceml_otel.report import render
from traceml_otel.report.svg import Line, line_chart
from traceml_otel.report.units import drift_sentence, seconds, throughput_gap


def test_a_one_rank_run_speaks_of_no_other_ranks_and_charts_no_collectives(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, input_wait=0.02) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert "over ranks" not in analysis.step.primary.why
    html = render(analysis, "html")
    assert "comm. wait" not in html and "median over ranks" not in html


def test_a_large_change_that_is_not_drift_is_not_called_stable_without_a_reason() -> None:
    noisy = DriftAnalysis(DriftKind.STABLE, baseline_s=0.0058, recent_s=0.0024, change=-0.594)
    text = drift_sentence(noisy)
    assert text.startswith("no sustained drift") and "within the step-to-step noise" in text
    assert "medians" in text and "not the means" in text
    calm = drift_sentence(DriftAnalysis(DriftKind.STABLE, baseline_s=0.010, recent_s=0.0101, change=0.01))
    assert calm.startswith("stable:")


def test_the_drift_label_sits_above_the_plotted_lines() -> None:
    lines = [Line("rank 0", "#000", list(range(100)), [0.01 if n < 50 else 0.02 for n in range(100)])]
    svg = line_chart(lines, y_format=seconds, x_label="step", title="t", marker=(50.0, "+100% from step 50"))
    label_y = float(re.search(r'y="([\d.]+)"[^>]*>\+100% from step 50<', svg).group(1))
    tops = [float(y) for y in re.findall(r",([\d.]+)", re.search(r'points="([^"]+)"', svg).group(1))]
    assert label_y < min(tops) - 4  # above the highest point of every line


def test_collectives_per_step_are_said_as_counts() -> None:
    assert calls_per_step(1.975) == "about 2 collectives"
    assert calls_per_step(2.0) == "2 collectives" and calls_per_step(1) == "1 collective"
    assert calls_per_step(0.97) == "about 1 collective" and calls_per_step(1.5) == "1.5 collectives"
    assert "." not in calls_per_step(48.7).removeprefix("about ")


def test_a_sample_count_on_every_step_is_never_called_fewer_than_half(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n) for n in range(3)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    every = Throughput(measured_ranks=1, observed_ranks=2, counted_steps=80, steps=80)
    text = throughput_gap(replace(analysis, throughput=every))
    assert "every step" in text and "fewer than half" not in text and "80 of 80" not in text
    some = Throughput(measured_ranks=1, observed_ranks=2, counted_steps=50, steps=80)
    text = throughput_gap(replace(analysis, throughput=some))
    assert "50 of 80 steps" in text and "1 rank counted them on fewer than half" in text
