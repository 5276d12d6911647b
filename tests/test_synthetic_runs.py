"""The synthetic-run helper writes what the emitter writes: strict OTLP, the emitter's resource and shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.synthetic_runs import SyntheticStep, otlp_lines, step_spans, write_run
from traceml_otel import contract as c
from traceml_otel._version import __version__


def test_a_run_parses_as_strict_otlp_with_the_emitter_resource(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=r, step=n, world_size=2, h2d=0.002, forward_calls=2, samples=8)
             for r in range(2) for n in range(12)]
    run = write_run(tmp_path / "run", "r1", steps, steps_per_line=5, cpus=4)
    lines = (run / c.traces_file_name(1)).read_text().splitlines()
    assert len(lines) == 3  # 5 + 5 + 2 steps: one line per batch, as the emitter writes
    spans = read_run(run)
    roots = [s for s in spans if s.name == c.SPAN_STEP]
    assert len(roots) == 24 and len(spans) == 24 * 6  # step, 2 forward calls, backward, optimizer, h2d
    resource = roots[0].resource
    assert resource["service.name"] == "traceml-synthetic" and resource[c.ATTR_RUN_ID] == "r1"
    assert resource["telemetry.sdk.name"] == "opentelemetry"  # the SDK's resource, as in production
    first = next(s for s in roots if s.attributes[c.ATTR_RANK] == 0 and s.attributes[c.ATTR_STEP] == 0)
    assert first.attributes[c.ATTR_STEP_CPU_DURATION] == pytest.approx(0.0155)  # 4+8+1+2 ms, 0.5 residual
    assert first.attributes[c.ATTR_CLOCK] == "cpu" and first.attributes[c.ATTR_STEP_SAMPLES] == 8
    assert first.attributes[c.ATTR_HOST_CPUS] == 4
    assert sum(c.ATTR_HOST_CPUS in s.attributes for s in roots) == 2  # once per rank, on its first step
    children = [s for s in spans if s.parent_span_id == first.span_id]
    assert sorted(s.name for s in children) == sorted(
        ["traceml.forward", "traceml.forward", "traceml.backward", "traceml.optimizer", "traceml.h2d"]
    )
    assert all(first.start_ns <= s.start_ns and s.end_ns <= first.end_ns for s in children)
    assert next(s for s in children if s.name == "traceml.h2d").attributes[c.ATTR_H2D_BYTES] == 4096
    assert (run / c.MANIFEST_FILE).exists()


def test_gpu_steps_carry_gpu_timings_and_errors_a_status() -> None:
    root, *phases = step_spans("r1", SyntheticStep(rank=0, step=3, gpu=True, error="RuntimeError"), 10**18)
    attributes = {a["key"]: a["value"] for a in root["attributes"]}
    assert attributes[c.ATTR_CLOCK] == {"stringValue": "gpu"}
    assert c.ATTR_STEP_GPU_DURATION in attributes and c.ATTR_INPUT_WAIT_GPU in attributes
    assert root["status"] == {"message": "RuntimeError", "code": 2} and "parentSpanId" not in root
    assert all(any(a["key"] == c.ATTR_PHASE_GPU_DURATION for a in p["attributes"]) for p in phases)


def test_scope_is_the_emitters_and_lines_are_per_rank(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "r1", [SyntheticStep(rank=0, step=0)])
    line = (run / c.traces_file_name(0)).read_text()
    assert f'"scope":{{"name":"{c.INSTRUMENTATION_SCOPE}","version":"{__version__}"}}' in line
    steps = [SyntheticStep(rank=r, step=n, world_size=2) for n in range(3) for r in (1, 0)]
    assert [rank for rank, _ in otlp_lines("r1", steps, steps_per_line=2)] == [1, 0, 1, 0]


def test_a_rank_cannot_change_its_world_size(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=0, world_size=2), SyntheticStep(rank=0, step=1, world_size=4)]
    with pytest.raises(ValueError, match="rank 0 of 2"):
        write_run(tmp_path / "run", "r1", steps)


def test_ddp_buckets_become_one_collective_span_with_exposed_time_on_both_clocks() -> None:
    spans = step_spans("r1", SyntheticStep(rank=0, step=0, gpu=True, ddp_wait=0.002), 10**18)
    (collective,) = [s for s in spans if s["name"] == c.SPAN_COLLECTIVE]
    attributes = {a["key"]: a["value"] for a in collective["attributes"]}
    assert attributes[c.ATTR_COLLECTIVE_CALLS] == {"intValue": "2"}
    assert attributes[c.ATTR_COLLECTIVE_EXPOSED_CPU]["doubleValue"] == pytest.approx(0.002)
    assert attributes[c.ATTR_COLLECTIVE_EXPOSED_GPU]["doubleValue"] == pytest.approx(0.002)
