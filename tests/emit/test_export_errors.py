"""OTLP export failures name the protocol and the cause, provoked against real sockets."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tests.ports import free_port
from traceml_otel.emit.export_errors import failure_cause
from traceml_otel.emit.span_export import OtlpSpanShipper, quiet_sdk_exporter_logs
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, StepSpanBuilder
from traceml_otel.step_records import StepRecord


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_404() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()


@pytest.fixture
def dead_port() -> int:
    return free_port()


def _first_failure(protocol: str, port: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    quiet_sdk_exporter_logs()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    messages: list[str] = []
    scope = InstrumentationScope("traceml_otel", "0")
    convert = ReadableSpanFactory(Resource.create({}), scope).convert
    shipper = OtlpSpanShipper(exporter, ALWAYS_ON, f"127.0.0.1:{port}", convert, messages.append, protocol)
    spans = StepSpanBuilder(RankInfo("r", 0, 0, 1, 0, "h")).build(StepRecord(0, 1, 2))
    shipper.offer(spans.all())
    counts = shipper.close(15)
    assert counts.failed == 1 and len(messages) == 1
    return messages[0]


def test_timeouts_and_unknown_causes() -> None:
    assert failure_cause(["StatusCode.DEADLINE_EXCEEDED"], "grpc").startswith("timeout")
    assert failure_cause(["odd failure at http://user:secret@host/x"], "grpc") == (
        "odd failure at http://***@host/x")
    assert "without a reason" in failure_cause([], "grpc")
    port = free_port()
    final = "Failed to export spans batch due to timeout, max retries or shutdown."
    cause = failure_cause([final], "http/protobuf", f"http://127.0.0.1:{port}/v1/traces")
    assert cause.startswith("connection refused")


def test_http_status_is_named(http_404: int, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _first_failure("http/protobuf", http_404, monkeypatch)
    assert "HTTP 404 Not Found" in message, message


def test_grpc_against_an_http_server_is_a_wrong_protocol(
    http_404: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _first_failure("grpc", http_404, monkeypatch)
    assert "wrong protocol" in message and "http/protobuf" in message, message


def test_refused_connection_is_named(dead_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # last in this file: after a refused gRPC export, grpcio fails later exporters of the process at once
    for protocol in ("http/protobuf", "grpc"):
        message = _first_failure(protocol, dead_port, monkeypatch)
        assert f"({protocol})" in message and "connection refused" in message, message
