"""A real OTLP/HTTP receiver for tests: decodes what it receives and keeps it.

with OtlpHttpReceiver() as receiver:
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    ...
    spans = receiver.wait_for_spans(3, timeout=5)
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

LOCALHOST = "127.0.0.1"


def any_value(value: AnyValue) -> Any:
    """The Python value of an OTLP AnyValue (arrays and maps included)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_dict(attributes: Sequence[KeyValue]) -> dict[str, Any]:
    """OTLP key/value pairs as a plain dict."""
    return {kv.key: any_value(kv.value) for kv in attributes}


@dataclass(frozen=True)
class ReceivedSpan:
    """One decoded span with the resource and scope it arrived under."""

    span: Span
    resource: dict[str, Any]
    scope_name: str

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_dict(self.span.attributes)

    @property
    def trace_id(self) -> int:
        return int.from_bytes(self.span.trace_id, "big")

    @property
    def span_id(self) -> int:
        return int.from_bytes(self.span.span_id, "big")

    @property
    def parent_span_id(self) -> int:
        """0 for a root span."""
        return int.from_bytes(self.span.parent_span_id, "big") if self.span.parent_span_id else 0


@dataclass(frozen=True)
class ReceivedMetric:
    """One decoded metric with the resource it arrived under."""

    metric: Metric
    resource: dict[str, Any]


@dataclass
class _Store:
    """What the receiver got; guarded by one lock, waited on with a condition."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: list[ReceivedMetric] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


def _decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _make_handler(store: _Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            handlers: dict[str, Callable[[bytes], bytes]] = {
                "/v1/traces": self._traces,
                "/v1/metrics": self._metrics,
            }
            handle = handlers.get(self.path.split("?", 1)[0])
            if handle is None:
                self._reply(404, b"")
                return
            content_type = self.headers.get("Content-Type", "")
            if "protobuf" not in content_type:
                self._fail(415, f"{self.path}: unsupported Content-Type {content_type!r}")
                return
            try:
                body = _decode_body(raw, self.headers.get("Content-Encoding", ""))
                self._reply(200, handle(body))
            except Exception as exc:  # a bad request must not kill the server thread
                self._fail(400, f"{self.path}: {type(exc).__name__}: {exc}")

        def _traces(self, body: bytes) -> bytes:
            request = ExportTraceServiceRequest.FromString(body)
            got = [
                ReceivedSpan(span, attributes_dict(rs.resource.attributes), ss.scope.name)
                for rs in request.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]
            with store.changed:
                store.spans.extend(got)
                store.changed.notify_all()
            return ExportTraceServiceResponse().SerializeToString()

        def _metrics(self, body: bytes) -> bytes:
            request = ExportMetricsServiceRequest.FromString(body)
            got = [
                ReceivedMetric(metric, attributes_dict(rm.resource.attributes))
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
            ]
            with store.changed:
                store.metrics.extend(got)
                store.changed.notify_all()
            return ExportMetricsServiceResponse().SerializeToString()

        def _fail(self, status: int, message: str) -> None:
            with store.changed:
                store.errors.append(message)
            self._reply(status, message.encode())

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Silence the per-request access log."""

    return Handler


class OtlpHttpReceiver:
    """An OTLP/HTTP (protobuf) server on 127.0.0.1 that keeps what it receives.

    Accepts POST /v1/traces and /v1/metrics, gzip or plain. Thread-safe; use as a
    context manager or call start()/stop().
    """

    def __init__(self, port: int = 0) -> None:
        self._store = _Store()
        self._server = ThreadingHTTPServer((LOCALHOST, port), _make_handler(self._store))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT (signal paths not included)."""
        return f"http://{LOCALHOST}:{self.port}"

    def start(self) -> OtlpHttpReceiver:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OtlpHttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        """A snapshot of every span received so far, in arrival order."""
        with self._store.changed:
            return list(self._store.spans)

    def metrics(self) -> list[ReceivedMetric]:
        """A snapshot of every metric received so far, in arrival order."""
        with self._store.changed:
            return list(self._store.metrics)

    def metric_names(self) -> set[str]:
        return {m.metric.name for m in self.metrics()}

    def errors(self) -> list[str]:
        """Requests the receiver rejected, with the reason."""
        with self._store.changed:
            return list(self._store.errors)

    def wait_for_spans(
        self, n: int, timeout: float = 10.0, where: Callable[[ReceivedSpan], bool] | None = None
    ) -> list[ReceivedSpan]:
        """Block until at least n spans (matching ``where``) arrived; return them.

        Raises:
            TimeoutError: fewer than n arrived in time (the message says how many).
        """

        def matching() -> list[ReceivedSpan]:
            return [s for s in self._store.spans if where is None or where(s)]

        with self._store.changed:
            if self._store.changed.wait_for(lambda: len(matching()) >= n, timeout=timeout):
                return matching()
            raise TimeoutError(
                f"{len(matching())} of {n} spans after {timeout} s; errors: {self._store.errors}"
            )

    def wait_for_metrics(self, names: set[str], timeout: float = 10.0) -> set[str]:
        """Block until every metric name in ``names`` arrived; return all names seen."""

        def seen() -> set[str]:
            return {m.metric.name for m in self._store.metrics}

        with self._store.changed:
            if self._store.changed.wait_for(lambda: names <= seen(), timeout=timeout):
                return seen()
            raise TimeoutError(f"missing metrics {sorted(names - seen())} after {timeout} s")
