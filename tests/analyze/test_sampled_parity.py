"""The analyzer on a 10 % span-budget sample gives the verdict it gives on every span, shares within 3 points.

Each diagnosis scenario runs once under ``traceml run``; its local copy (every step) is replayed
through the emitter's span budget (:mod:`tests.sampled_spans`), and both span sets are read back
through a fake Tempo (the search API's documented shape, as in ``test_analyze_backends.py``):
``traceml analyze --tempo`` weights the sample by 1/probability and says it read a sample.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.analyze.test_analyze_backends import RUN, Trace, tempo_handler
from tests.sampled_spans import attributes, read_local_spans, sample_run_spans
from traceml_otel import contract as c
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.measures import share
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.sources.base import ReadLog
from traceml_otel.analyze.sources.tempo import TempoSpanSource
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.emit.span_budget import BudgetSettings

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "examples" / "diagnosis"
SHARES = ("input_wait", "h2d", "forward", "backward", "optimizer", "communication", "residual")


def run_scenario(tmp_path: Path, script: str, steps: int, *launcher: str) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=path, TRACEML_LIVE="off")
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", RUN, str(SCENARIOS / script), *launcher,
         "--", "--steps", str(steps)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "runs" / RUN


def through_tempo(serve: Callable[[type[BaseHTTPRequestHandler]], str], spans: list[dict]) -> RunAnalysis:
    traces: dict[str, Trace] = {}
    for span in spans:
        start_s = int(span["startTimeUnixNano"]) / 1e9
        trace = traces.setdefault(span["traceId"], Trace(span["traceId"], start_s))
        trace.start_s = min(trace.start_s, start_s)
        trace.spans.append((attributes(span)[c.ATTR_RANK], span))
    starts = [t.start_s for t in traces.values()]
    source = TempoSpanSource(serve(tempo_handler(traces)), run_id=RUN, when=TimeRange(min(starts) - 5,
                             max(starts) + 5), log=ReadLog(printed=0))
    return analyze_run(source.load())


def shares(analysis: RunAnalysis) -> dict[str, float]:
    return {name: share(analysis.ranks, name) or 0.0 for name in SHARES}


@pytest.mark.parametrize(("script", "steps", "launcher"), [
    ("input_bound.py", 300, ()),
    ("residual_heavy.py", 500, ()),
    ("compute_bound.py", 200, ()),
    ("input_straggler.py", 300, ("--nproc-per-node", "2")),
])
def test_a_sample_gives_the_same_verdict(serve, tmp_path: Path, script: str, steps: int,
                                         launcher: tuple[str, ...]) -> None:
    run_dir = run_scenario(tmp_path, script, steps, *launcher)
    spans = read_local_spans(run_dir)
    world = 2 if launcher else 1
    sampled, _ = sample_run_spans(spans, BudgetSettings("sampled", 0.1, 0.0), world)
    assert len(sampled) < 0.35 * len(spans)  # a sample: 10 % plus the anomalous steps
    everything = through_tempo(serve, spans)
    sample = through_tempo(serve, sampled)
    assert "a sample:" in sample.run.source and "a sample:" not in everything.run.source
    assert sample.step.primary.kind is everything.step.primary.kind, (sample.step.primary.why,
                                                                      everything.step.primary.why)
    full, part = shares(everything), shares(sample)
    assert all(abs(full[name] - part[name]) <= 0.03 for name in SHARES), (full, part)


def test_the_weight_comes_from_the_attribute_or_the_tracestate() -> None:
    from traceml_otel.analyze.assembler import StepAssembler

    assembler = StepAssembler()
    base = {c.ATTR_RUN_ID: "r", c.ATTR_STEP_CPU_DURATION: 0.1, c.ATTR_RANK: 0}
    th = c.ATTR_SAMPLING_THRESHOLD
    span = {"traceId": "ab" * 16, "startTimeUnixNano": 1, "endTimeUnixNano": 2}
    assembler.add_span(c.SPAN_STEP, {**base, c.ATTR_STEP: 1, th: "c"}, span)
    assembler.add_span(c.SPAN_STEP, {**base, c.ATTR_STEP: 2},
                       {**span, "traceState": "x=1,ot=th:e6666666666666;rv:00000000000001"})
    assembler.add_span(c.SPAN_STEP, {**base, c.ATTR_STEP: 3}, span)
    assembler.add_span(c.SPAN_STEP, {**base, c.ATTR_STEP: 4, th: "0"}, span)
    steps, _ = assembler.steps("r")
    assert [s.weight for s in sorted(steps, key=lambda s: s.step)] == pytest.approx([4.0, 10.0, 1.0, 1.0])
