"""Our emitter's OTLP export through a real collector (rotel) into a receiver: spans arrive intact."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.ports import free_port
from traceml_otel import contract as c

STEADY = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "steady_loop.py"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_arrive_intact(stack, protocol: str, tmp_path: Path) -> None:
    receiver, collector = stack
    endpoint = collector.grpc_endpoint if protocol == "grpc" else collector.http_endpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(
        TRACEML_RUNS_DIR=str(tmp_path), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_SERVICE_NAME="rotel-e2e",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test", OTEL_METRIC_EXPORT_INTERVAL="500",
    )
    steps = 25
    result = subprocess.run([sys.executable, str(STEADY), "--steps", str(steps)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = steps * 4  # step + forward + backward + optimizer
    received = receiver.wait_for_spans(expected, timeout=20)
    assert len(received) == expected
    (run_dir,) = tmp_path.iterdir()
    local = {(s.span_id): s for s in read_run(run_dir)}
    by_trace: dict[int, list] = defaultdict(list)
    for span in received:
        original = local[f"{span.span_id:016x}"]  # same ids end to end
        assert span.name == original.name
        assert f"{span.trace_id:032x}" == original.trace_id
        assert span.attributes == original.attributes
        assert span.resource["service.name"] == "rotel-e2e"
        assert span.resource["deployment.environment.name"] == "test"
        by_trace[span.trace_id].append(span)
    for spans in by_trace.values():
        (root,) = [s for s in spans if s.name == c.SPAN_STEP]
        assert all(s.parent_span_id == root.span_id for s in spans if s is not root)
    names = receiver.wait_for_metrics({c.METRIC_STEP_DURATION, c.METRIC_PHASE_DURATION, c.METRIC_STEPS},
                                      timeout=20)
    assert c.METRIC_STEP_DURATION in names
    step_trace_ids = {s.trace_id for s in local.values() if s.name == c.SPAN_STEP}
    histograms = [m.metric for m in receiver.metrics() if m.metric.name == c.METRIC_STEP_DURATION]
    points = [point for metric in histograms for point in metric.histogram.data_points]
    assert histograms[0].unit == "s"
    assert max(point.count for point in points) == steps
    for point in points:
        attributes = {kv.key for kv in point.attributes}
        assert attributes == {c.ATTR_JOB, c.ATTR_RUN_ID, c.ATTR_RANK}  # never the step number
        assert list(point.explicit_bounds) == list(c.DURATION_BUCKETS_S)
    exemplar_traces = {e.trace_id.hex() for point in points for e in point.exemplars}
    assert exemplar_traces and exemplar_traces <= step_trace_ids  # exemplars open the step's trace


def test_prometheus_scrape_endpoint_serves_the_contract_names(tmp_path: Path) -> None:
    import time
    import urllib.request

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path), TRACEML_PROMETHEUS_PORT=str(port), TRACEML_FLUSH_STEPS="4")
    process = subprocess.Popen([sys.executable, str(STEADY), "--steps", "400", "--sleep", "0.02"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    body = ""
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and "traceml_steps_total{" not in body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    body = response.read().decode()
            except OSError:
                time.sleep(0.2)
    finally:
        process.kill()
        process.communicate(timeout=30)
    (steps,) = [line for line in body.splitlines() if line.startswith("traceml_steps_total{")]
    assert 'traceml_rank="0"' in steps and 'traceml_run_id="' in steps and 'traceml_job="' in steps
    for family in ("traceml_step_duration_seconds_bucket", "traceml_phase_duration_seconds_sum",
                   "traceml_input_wait_duration_seconds"):
        assert family in body
    assert 'traceml_phase_name="forward"' in body
    assert "traceml_cuda_memory_peak_reserved_bytes{" not in body  # a CPU run: missing, not 0
