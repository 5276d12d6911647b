"""Deep captures end to end: real ``traceml run`` processes with a planted problem each
(``tests/capture/scripts/capture_loops.py``), the captures they leave and what their summaries name."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.capture.profiler_capture import USER_PROFILER
from traceml_otel.report.html import render_html
from traceml_otel.report.json_report import report_json
from traceml_otel.report.text import render_text
from traceml_otel.wire.capture_record import CaptureSummary, read_summaries

REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "tests" / "capture" / "scripts" / "capture_loops.py"


def _run(tmp_path: Path, *args: str, **env_extra: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    # The default settings: these loops last a few seconds, and their planted anomaly pays for its capture
    # (the cost budget's anomaly share, docs/captures.md); no TRACEML_CAPTURE_BUDGET override.
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    env.update(env_extra)
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", str(LOOPS), "--", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir, result


def _captures(run_dir: Path) -> list[CaptureSummary]:
    summaries, problems = read_summaries(run_dir)
    assert not problems
    return [s for s in summaries if s.index > 0]


def _top(summary: CaptureSummary, n: int = 3) -> list[str]:
    return [op.name for op in summary.top_cpu[:n]]


def test_planted_svd_every_40th_step_is_captured_and_named(tmp_path: Path) -> None:
    run_dir, result = _run(tmp_path, "--loop", "svd", "--steps", "400", "--every", "40", "--sleep", "0.002")
    captures = _captures(run_dir)
    assert captures, result.stderr[-2000:]
    covering = [c for c in captures if any(step % 40 == 39 for step in c.steps)]
    assert covering, [(c.reason, c.steps, c.detail) for c in captures]
    capture = covering[0]
    assert capture.reason == "spike" and "recurs every 40 steps" in capture.detail
    assert any("svd" in name for name in _top(capture)), _top(capture, 6)
    svd = next(op for op in capture.top_cpu if "svd" in op.name)
    assert svd.frame.startswith("capture_loops.py(") and svd.frame.endswith(": loop"), svd.frame
    assert capture.frames and capture.frames[0].name == svd.frame  # the loop's function called it
    # The trace opens as Chrome/Perfetto JSON and holds the operator.
    trace = json.loads(gzip.decompress((run_dir / capture.trace_file).read_bytes()))
    assert any("svd" in str(event.get("name", "")) for event in trace["traceEvents"])
    assert capture.trace_bytes == (run_dir / capture.trace_file).stat().st_size < 64 << 20
    assert len(capture.step_ms) == len(capture.steps) == 3 and capture.median_ms and capture.median_ms > 0
    assert capture.activities == ("cpu",) and capture.with_stack
    assert f"capture {capture.index} (spike" in result.stderr
    assert not list(run_dir.glob(".*.part*"))  # no temporary file left
    # The reports' Captures section names the capture and its operator.
    analysis = analyze_path([run_dir])
    text = render_text(analysis)
    assert f"Captures ({len(captures)})" in text and capture.label() in text and svd.name in text
    document = report_json(analysis)
    assert {c["index"] for c in document["captures"]} == {c.index for c in captures}
    assert capture.trace_file in render_html(analysis) and "<h2>Captures (" in render_html(analysis)
    # One traceml.capture span per capture, in the trace of its first step, in the local copy.
    spans = {s.attributes[c.ATTR_CAPTURE_INDEX]: s for s in read_run(run_dir) if s.name == c.SPAN_CAPTURE}
    assert set(spans) == {c_.index for c_ in captures}
    span = spans[capture.index]
    assert [v.int_value for v in span.attributes[c.ATTR_CAPTURE_STEPS].values] == list(capture.steps)
    assert span.attributes[c.ATTR_CAPTURE_TRACE_FILE] == capture.trace_file
    assert "svd" in span.attributes[c.ATTR_CAPTURE_TOP_OPERATOR] or capture.top_cpu[0].name in \
        span.attributes[c.ATTR_CAPTURE_TOP_OPERATOR]
    assert span.trace_id == f"{c.step_trace_id(capture.run_id, capture.steps[0]):032x}"


def test_residual_heavy_loop_capture_names_the_item_sync(tmp_path: Path) -> None:
    run_dir, result = _run(tmp_path, "--loop", "item", "--steps", "300", "--sleep", "0.005")
    captures = _captures(run_dir)
    assert captures, result.stderr[-2000:]
    capture = captures[0]
    assert capture.reason == "residual", (capture.reason, capture.detail)
    names = {op.name for op in capture.syncs}
    assert {"aten::item", "aten::_local_scalar_dense"} & names, capture.syncs
    item = next(op for op in capture.syncs if op.name == "aten::item")
    assert item.count == len(capture.steps) and item.frame.endswith(": loop")
    # The RESIDUAL_HEAVY finding points at the capture and the sync.
    step = analyze_path([run_dir]).step
    (residual,) = [f for f in (step.primary, *step.issues) if f.kind == StepKind.RESIDUAL_HEAVY][:1]
    assert ("capture", capture.label(), "") in [(e.name, e.value, e.unit) for e in residual.evidence]
    assert f"Capture {capture.label()}" in residual.why and "aten::item x" in residual.why


def test_spike_every_5_steps_makes_at_most_k_captures(tmp_path: Path) -> None:
    run_dir, _ = _run(tmp_path, "--loop", "spike", "--steps", "300", "--every", "5", "--sleep", "0.005",
                      TRACEML_CAPTURE_INTERVAL_S="0", TRACEML_CAPTURE_MAX="2")
    captures = _captures(run_dir)
    assert 1 <= len(captures) <= 2, [(c.reason, c.steps) for c in captures]
    status = json.loads((run_dir / "rank-0.capture-status.json").read_text())
    assert status["started"] == len(captures) and status["limits"]["max_per_rank"] == 2
    assert all(c.limits["max_per_rank"] == 2 for c in captures)
    assert len(list(run_dir.glob("rank-0.capture-*.trace.json.gz"))) == len(captures)


def test_default_interval_allows_one_capture_per_rank(tmp_path: Path) -> None:
    run_dir, _ = _run(tmp_path, "--loop", "spike", "--steps", "200", "--every", "5", "--sleep", "0.005")
    captures = _captures(run_dir)
    assert len(captures) == 1 and captures[0].limits["interval_s"] == 600


def test_user_profiler_running_means_no_second_profiler_and_one_line(tmp_path: Path) -> None:
    run_dir, result = _run(tmp_path, "--loop", "user_profiler", "--steps", "300", "--every", "20",
                           "--sleep", "0.005", TRACEML_CAPTURE_INTERVAL_S="0")
    assert not list(run_dir.glob("*.trace.json.gz"))
    assert result.stderr.count(USER_PROFILER) == 1, result.stderr[-2000:]
    summaries, _ = read_summaries(run_dir)
    (note,) = summaries
    assert note.index == 0 and note.problem == USER_PROFILER and not note.trace_file
