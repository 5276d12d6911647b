"""The OTLP test helpers work end to end with the plain OTel SDK.

SDK -> rotel-agent (OTLP gRPC or HTTP) -> OtlpHttpReceiver, all on 127.0.0.1.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.integration.otlp_stack import OtlpHttpReceiver, ReceivedSpan, RotelCollector, free_port, port_open
from tests.tools import PIP_TEST, missing


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    with OtlpHttpReceiver() as server:
        yield server


@pytest.fixture(scope="module")
def rotel(receiver: OtlpHttpReceiver) -> Iterator[RotelCollector]:
    collector = RotelCollector(receiver.endpoint)
    try:
        collector.start()
    except FileNotFoundError:
        missing("rotel (the rotel-agent collector)", PIP_TEST)
    yield collector
    collector.stop()


def emit_step(exporter: SpanExporter, run_id: str) -> list[ReadableSpan]:
    """One traceml-shaped step (root + 2 children) through ``exporter``; the SDK's view of it."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "otlp-stack-test", "traceml.run.id": run_id})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("traceml_otel", "0.0.test")
    common = {"traceml.run.id": run_id, "traceml.rank": 3, "traceml.step.number": 7}
    with tracer.start_as_current_span("traceml.step", attributes={**common, "traceml.clock": "cpu"}):
        for phase in ("forward", "backward"):
            attrs = {**common, "traceml.phase.name": phase, "traceml.phase.cpu_duration": 0.0125}
            with tracer.start_as_current_span(f"traceml.{phase}", attributes=attrs):
                pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def assert_intact(sent: list[ReadableSpan], got: list[ReceivedSpan], run_id: str) -> None:
    by_id = {g.span_id: g for g in got}
    assert len(by_id) == len(sent) == len(got)
    for s in sent:
        g = by_id[s.context.span_id]
        assert g.name == s.name
        assert g.trace_id == s.context.trace_id
        assert g.parent_span_id == (s.parent.span_id if s.parent else 0)
        assert g.attributes == dict(s.attributes or {})
        assert g.span.start_time_unix_nano == s.start_time
        assert g.span.end_time_unix_nano == s.end_time
        assert g.resource["service.name"] == "otlp-stack-test"
        assert g.resource["traceml.run.id"] == run_id
        assert g.scope_name == "traceml_otel"
    assert len({g.trace_id for g in got}) == 1


def spans_of(run_id: str) -> Callable[[ReceivedSpan], bool]:
    return lambda s: s.resource.get("traceml.run.id") == run_id


def test_grpc_exporter_through_rotel(receiver: OtlpHttpReceiver, rotel: RotelCollector) -> None:
    run_id = uuid.uuid4().hex
    sent = emit_step(GrpcSpanExporter(endpoint=rotel.grpc_endpoint, insecure=True), run_id)
    got = receiver.wait_for_spans(len(sent), timeout=5, where=spans_of(run_id))
    assert_intact(sent, got, run_id)


def test_http_exporter_through_rotel(receiver: OtlpHttpReceiver, rotel: RotelCollector) -> None:
    run_id = uuid.uuid4().hex
    sent = emit_step(HttpSpanExporter(endpoint=f"{rotel.http_endpoint}/v1/traces"), run_id)
    got = receiver.wait_for_spans(len(sent), timeout=5, where=spans_of(run_id))
    assert_intact(sent, got, run_id)


def test_receiver_takes_gzip_directly(receiver: OtlpHttpReceiver) -> None:
    run_id = uuid.uuid4().hex
    exporter = HttpSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", compression=Compression.Gzip)
    sent = emit_step(exporter, run_id)
    assert_intact(sent, receiver.wait_for_spans(len(sent), timeout=5, where=spans_of(run_id)), run_id)
    assert receiver.errors() == []


def test_rotel_forwards_metrics(receiver: OtlpHttpReceiver, rotel: RotelCollector) -> None:
    exporter = OTLPMetricExporter(endpoint=rotel.grpc_endpoint, insecure=True)
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter, 600_000)])
    meter = provider.get_meter("traceml_otel")
    attrs = {"traceml.run.id": "metrics-run", "traceml.rank": 0}
    meter.create_histogram("traceml.step.duration", unit="s").record(0.25, attrs)
    meter.create_counter("traceml.steps", unit="{step}").add(1, attrs)
    provider.shutdown()  # final export
    names = receiver.wait_for_metrics({"traceml.step.duration", "traceml.steps"}, timeout=5)
    assert {"traceml.step.duration", "traceml.steps"} <= names


def test_collector_stops_and_frees_ports(receiver: OtlpHttpReceiver) -> None:
    with RotelCollector(receiver.endpoint) as collector:
        assert port_open(collector.grpc_port) and port_open(collector.http_port)
        # rotel opens its ports a moment before it logs its start; stopped at once, it may log
        # nothing (2 of 10 quick starts on this VM), so wait for the line, bounded.
        deadline = time.monotonic() + 10
        while "Starting Rotel" not in collector.log_tail() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert not port_open(collector.grpc_port)
    assert "Starting Rotel" in collector.log_tail()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with OtlpHttpReceiver(port) as server:
        assert server.endpoint == f"http://127.0.0.1:{port}"
