"""One colour per phase and time category across every HTML chart (issue: input wait was orange in one
chart and red in the other, start-up took forward's blue)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from traceml_otel.report.palette import CATEGORY_COLORS, PHASE_COLORS, RANK_COLORS, category_colors
from traceml_otel.report.units import PHASE_LABELS

REPO = Path(__file__).resolve().parents[2]
LEGEND = re.compile(r'<rect x="[\d.]+" y="[\d.]+" width="12" height="12" rx="2" fill="(#[0-9a-f]{6})"/>'
                    r'<text [^>]*>([^<]+)</text>')


def test_every_phase_and_category_has_its_own_colour() -> None:
    colors = list(PHASE_COLORS.values()) + list(CATEGORY_COLORS.values())
    assert len(set(colors)) == len(colors)
    assert not set(RANK_COLORS) & set(colors)
    phases = [f"step.{name}" for name in PHASE_COLORS]
    assert category_colors(phases) == list(PHASE_COLORS.values())
    extra = category_colors(["outside.eval-a", "outside.eval-b", "startup"])
    assert len(set(extra)) == 3 and not set(extra[:2]) & set(colors)


def test_a_real_reports_charts_draw_each_phase_in_one_colour(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", "--html-report",
                           str(REPO / "tests/report/scripts/evaluated_loop.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    html = (run_dir / "report.html").read_text()
    legend = LEGEND.findall(html)
    by_label: dict[str, set[str]] = {}
    for color, label in legend:
        name = label.removeprefix("step: ")
        by_label.setdefault({"other (residual)": "residual"}.get(name, name), set()).add(color)
    assert by_label, "no chart legend found"
    labels_of_color: dict[str, set[str]] = {}
    for label, colors in by_label.items():
        assert len(colors) == 1, (label, colors)  # one colour wherever the label is drawn
        labels_of_color.setdefault(next(iter(colors)), set()).add(label)
    phase_names = {PHASE_LABELS[name]: name for name in PHASE_COLORS} | {"input_wait": "input_wait"}
    for color, labels in labels_of_color.items():
        phases = {phase_names.get(label, label.replace(" ", "_")) for label in labels}
        assert len(phases) == 1, (color, labels)  # no colour stands for two things
    assert by_label["input wait"] == {PHASE_COLORS["input_wait"]}
    assert sum(label.removeprefix("step: ") == "input wait" for _, label in legend) >= 2  # both charts
    assert by_label["start-up"] == {CATEGORY_COLORS["startup"]}
    assert by_label["evaluation"] == {CATEGORY_COLORS["outside.evaluation"]}
