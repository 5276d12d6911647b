"""Text, JSON and HTML reports of synthetic runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.report import SCHEMA, SCHEMA_VERSION, render, report_json


def straggler_run(tmp_path: Path, run_id: str = "strag-1") -> RunAnalysis:
    steps = [
        SyntheticStep(
            rank=r,
            step=n,
            world_size=2,
            parallelism="ddp",
            input_wait=0.02 if r == 1 else 0.001,
            backward=0.008 if r == 1 else 0.027,
        )
        for r in range(2)
        for n in range(40)
    ]
    return analyze_path([write_run(tmp_path / run_id, run_id, steps)])


def single_rank_run(tmp_path: Path, **step: object) -> RunAnalysis:
    steps = [SyntheticStep(rank=0, step=n, **step) for n in range(30)]  # type: ignore[arg-type]
    return analyze_path([write_run(tmp_path / "single", "single", steps)])


def test_text_leads_with_verdict_why_next_then_the_phase_table(tmp_path: Path) -> None:
    text = render(straggler_run(tmp_path), "text")
    labels = [line.split()[0] for line in text.splitlines() if line[:1].isalpha()]
    assert labels.index("Verdict") < labels.index("Why") < labels.index("Next") < labels.index("Where")
    assert "INPUT STRAGGLER [critical]" in text
    header = next(line for line in text.splitlines() if line.startswith("phase"))
    assert header.split() == ["phase", "average", "share", "worst", "skew", "worst", "rank"]
    rows = {line.split()[0] for line in text.splitlines()[text.splitlines().index(header) + 1 :][:7]}
    assert rows >= {"input", "h2d", "forward", "backward", "optimizer", "residual", "step"}
    assert "Memory     NO GPU" in text
    assert re.search(r"step \d+\s+rank \d\s+[\d.]+ ms .* trace [0-9a-f]{32}", text)


def test_single_rank_table_has_average_and_share_only(tmp_path: Path) -> None:
    text = render(single_rank_run(tmp_path, input_wait=0.02), "text")
    header = next(line for line in text.splitlines() if line.startswith("phase"))
    assert header.split() == ["phase", "average", "share"]
    assert "INPUT BOUND" in text


def test_text_shows_gradient_accumulation(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, optimizer_steps=1 if n % 2 else 0) for n in range(30)]
    text = render(analyze_path([write_run(tmp_path / "acc", "acc", steps)]), "text")
    assert "15 optimizer updates" in text and "2.0 traced steps per update" in text


def test_json_report_schema(tmp_path: Path) -> None:
    document = json.loads(render(straggler_run(tmp_path), "json"))
    assert document["schema"] == SCHEMA and document["schema_version"] == SCHEMA_VERSION
    assert document["primary_diagnosis"]["kind"] == "INPUT_STRAGGLER"
    assert document["primary_diagnosis"]["severity"] == "critical"
    assert {
        "run",
        "window",
        "clock",
        "issues",
        "abstentions",
        "phases",
        "ranks",
        "memory",
        "drift",
        "worst_steps",
        "series",
        "accumulation",
        "severity_caps",
    } <= set(document)
    assert document["run"]["world_size"] == 2 and document["clock"] == "cpu"
    assert document["memory"]["status"] == "NO_GPU"
    phases = {p["name"]: p for p in document["phases"]}
    assert phases["backward"]["worst_rank"] == 0 and phases["step_time"]["share"] == pytest.approx(1.0)
    assert len(document["worst_steps"][0]["trace_id"]) == 32


def test_json_keeps_missing_as_null(tmp_path: Path) -> None:
    analysis = single_rank_run(tmp_path, forward=None)
    document = report_json(analysis)
    assert document["primary_diagnosis"]["kind"] == StepKind.INCOMPLETE_DATA
    phases = {p["name"]: p for p in document["phases"]}
    assert phases["forward"]["median_s"] is None and phases["residual"]["share"] is None
    assert document["ranks"][0]["forward_s"] is None
    assert document["abstentions"][0]["missing"][0] == {
        "signal": "forward",
        "measured_ranks": 0,
        "observed_ranks": 1,
    }
    json.dumps(document, allow_nan=False)


HOSTILE = '<script>alert("x")</script>&"'


def test_html_is_self_contained_and_escapes_every_string(tmp_path: Path) -> None:
    run = write_run(tmp_path / "evil", HOSTILE, [SyntheticStep(rank=0, step=n) for n in range(25)])
    page = render(analyze_path([run]), "html")
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 2
    assert "<script" not in page.lower()
    for forbidden in ("src=", "href=", "url(", "@import", "<link", "<iframe"):
        assert forbidden not in page
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * page.count("<svg")
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&quot;" in page


def test_html_shows_memory_chart_on_gpu_runs(tmp_path: Path) -> None:
    steps = [
        SyntheticStep(
            rank=r,
            step=n,
            gpu=True,
            world_size=2,
            peak_allocated=(2 + n // 20) << 30,
            peak_reserved=(3 + n // 20) << 30,
            memory_total=80 << 30,
        )
        for r in range(2)
        for n in range(60)
    ]
    analysis = analyze_path([write_run(tmp_path / "gpu", "gpu", steps)])
    assert analysis.clock == "gpu"
    page = render(analysis, "html")
    assert "Peak reserved memory per rank" in page and "NO GPU" not in page
    assert "MEMORY" in render(analysis, "text")


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown report format"):
        render(None, "pdf")  # type: ignore[arg-type]


def test_trace_ids_become_links_with_a_template(tmp_path: Path) -> None:
    import subprocess
    import sys

    run_dir = write_run(tmp_path / "run", "linked", [SyntheticStep(rank=0, step=n) for n in range(30)])
    template = "http://jaeger.local:16686/trace/{trace_id}?x=1&y=2"
    command = [sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir), "--trace-url", template]
    html = subprocess.run([*command, "--format", "html"], capture_output=True, text=True, timeout=60)
    assert html.returncode == 0, html.stderr
    assert '<a href="http://jaeger.local:16686/trace/' in html.stdout and "?x=1&amp;y=2" in html.stdout
    assert "<span>1 rank</span>" in html.stdout  # singular
    text = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    assert "trace http://jaeger.local:16686/trace/" in text
    bad = subprocess.run([*command[:-1], "javascript:alert({trace_id})"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "not an http(s) URL" in bad.stderr
    plain = subprocess.run([*command[:-2], "--format", "html"], capture_output=True, text=True, timeout=60)
    assert "<a href" not in plain.stdout  # no template: plain ids
