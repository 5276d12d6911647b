"""Our OTLP encoders against the reference: the SDK's protobuf encoder, and the OTLP JSON mapping.

Every attribute kind our spans carry is in the sample: str (with quotes and non-ASCII), bool, small
and large and negative int, float (with NaN and infinities), lists, an error status, a parent, GPU
timings, collectives and a hang span.
"""

from __future__ import annotations

import json
import math

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tests.integration.otlp_receiver import OtlpHttpReceiver
from traceml_otel.emit.local_copy import traces_data_json
from traceml_otel.emit.otlp_encode import EncodedSpans, SpanEncoder
from traceml_otel.emit.span_export import OtlpSpanShipper, make_span_exporter
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, SpanData, StepSpanBuilder
from traceml_otel.step_records import CollectiveTiming, LoaderSettings, PhaseTiming, StepRecord

MS = 1_000_000
RESOURCE = Resource.create({"service.name": "t", "note": "quote \" and \u00e9", "n": 3, "f": 0.5, "b": True})
SCOPE = InstrumentationScope("traceml_otel", "9.9")


def _spans() -> list[SpanData]:
    builder = StepSpanBuilder(RankInfo(run_id="run-\u00e9", rank=3, local_rank=1, world_size=2048,
                                       node_rank=1, host="h\"ost", cpus=8))
    cpu = StepRecord(
        step=7, start_ns=1_000 * MS, end_ns=1_010 * MS, input_wait_ns=2 * MS, input_fetches=1,
        phases=(PhaseTiming("forward", 0, 1_001 * MS, 1_004 * MS),
                PhaseTiming("h2d", 1, 1_004 * MS, 1_005 * MS, nbytes=1 << 40),
                PhaseTiming("custom_phase", 0, 1_005 * MS, 1_008 * MS)),
        optimizer_steps=1, exception_type="RuntimeError", samples=64, tokens=2**40,
        loader=LoaderSettings(4, True, False, 2, 64, "TensorDataset"), source="trace_step",
        between_steps_ns=5,
    )
    gpu = StepRecord(
        step=2**40, start_ns=2_000 * MS, end_ns=2_010 * MS, gpu_duration_ns=12 * MS,
        phases=(PhaseTiming("backward", 0, 2_001 * MS, 2_004 * MS, gpu_offset_ns=MS,
                            gpu_duration_ns=4 * MS),),
        collectives=(CollectiveTiming("all_reduce", "ddp", 2_002 * MS, 2_003 * MS, 4096, False, MS, MS),
                     CollectiveTiming("broadcast", "api", 2_005 * MS, None, 8, True)),
        parallelism="ddp", peak_allocated_bytes=1 << 30, peak_reserved_bytes=2 << 30,
        device_total_bytes=80 << 30, optimizer_steps=0,
    )
    spans = builder.build(cpu).all() + builder.build(gpu).all()
    odd = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "neg": -5, "zero": 0, "big": 2**63 - 1,
           "empty": "", "false": False, "list": [1, 2], "strings": ["a", "\u00e9"], "floats": [0.1, -2.5]}
    spans.append(SpanData("traceml.hang", 1, 2, None, 3, 4, odd, error="hang"))
    return spans


def test_the_otlp_request_is_byte_identical_to_the_sdk_encoders() -> None:
    spans = _spans()
    sdk = encode_spans([ReadableSpanFactory(RESOURCE, SCOPE).convert(span) for span in spans])
    encoder = SpanEncoder(RESOURCE, SCOPE)
    ours = encoder.request([encoder.encode(span) for span in spans])
    assert ours == sdk.SerializeToString()
    decoded = ExportTraceServiceRequest.FromString(ours)
    assert decoded == sdk  # decodes to the same spans, field for field
    assert len(decoded.resource_spans[0].scope_spans[0].spans) == len(spans)
    again = encoder.request([encoder.encode(span) for span in spans])  # with every cache warm
    assert again == ours


def test_a_request_of_a_full_batch_is_byte_identical_too() -> None:
    """Thousands of spans: the enclosing messages' lengths take three-byte varints."""
    spans = _spans() * 400
    sdk = encode_spans([ReadableSpanFactory(RESOURCE, SCOPE).convert(span) for span in spans])
    encoder = SpanEncoder(RESOURCE, SCOPE)
    ours = encoder.request([encoder.encode(span) for span in spans])
    assert len(ours) > 1 << 20 and ours == sdk.SerializeToString()


@pytest.mark.parametrize("protocol", ["http/protobuf"])
def test_the_sdk_exporter_sends_our_bytes_and_the_receiver_decodes_the_same_spans(
    protocol: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's own HTTP transport carries an encoded batch (gRPC goes through rotel elsewhere)."""
    spans = _spans()
    with OtlpHttpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/v1/traces")
        encoder = SpanEncoder(RESOURCE, SCOPE)
        shipper = OtlpSpanShipper(make_span_exporter(protocol), _always_on(), receiver.endpoint,
                                  encoder.encode, protocol=protocol,
                                  batch=lambda batch: EncodedSpans(encoder, batch))
        for span in spans:
            shipper.offer([span])
        counts = shipper.close(10.0)
        assert counts.exported == len(spans) and counts.dropped == 0
        received = receiver.wait_for_spans(len(spans), timeout=5)
    expected = encode_spans([ReadableSpanFactory(RESOURCE, SCOPE).convert(span) for span in spans])
    assert [span.span for span in received] == list(expected.resource_spans[0].scope_spans[0].spans)


class _GrpcTraceReceiver:
    """A real gRPC server for the OTLP trace service on 127.0.0.1 that keeps each request's raw bytes."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self.requests: list[bytes] = []

        def export(request: bytes, context: object) -> ExportTraceServiceResponse:
            self.requests.append(request)
            return ExportTraceServiceResponse()

        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(
                export, response_serializer=ExportTraceServiceResponse.SerializeToString)},
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=(handler,))
        self.endpoint = f"http://127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(None)


def test_the_grpc_exporter_sends_our_bytes_unchanged_and_still_sends_sdk_spans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's gRPC transport carries an encoded batch's bytes as they are (no parse and re-serialise),
    and the same exporter still encodes and sends the SDK's own ``ReadableSpan`` batches."""
    spans = _spans()
    receiver = _GrpcTraceReceiver()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
        exporter = make_span_exporter("grpc")
        assert type(exporter._client).__name__ == "PassThroughStub"  # this SDK still lets us swap the stub
        encoder = SpanEncoder(RESOURCE, SCOPE)
        batch = EncodedSpans(encoder, [encoder.encode(span) for span in spans])
        readable = [ReadableSpanFactory(RESOURCE, SCOPE).convert(span) for span in spans]
        assert exporter.export(batch).name == "SUCCESS"
        assert exporter.export(readable).name == "SUCCESS"
        exporter.shutdown()
    finally:
        receiver.close()
    expected = encode_spans(readable)
    assert receiver.requests == [batch.request_bytes(), expected.SerializeToString()]
    assert receiver.requests[0] == expected.SerializeToString()  # our bytes are the SDK encoder's


def _always_on():
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    return ALWAYS_ON


def _reference_json(spans: list[SpanData]) -> str:
    """The OTLP JSON mapping written with ``json.dumps``: what the hand encoder must equal byte for byte."""
    def value(v: object) -> dict:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, str):
            return {"stringValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"arrayValue": {"values": [value(item) for item in v]}}  # type: ignore[union-attr]

    def attributes(mapping: dict) -> list:
        return [{"key": k, "value": value(v)} for k, v in mapping.items()]

    def span(s: SpanData) -> dict:
        out: dict = {"traceId": f"{s.trace_id:032x}", "spanId": f"{s.span_id:016x}"}
        if s.parent_span_id is not None:
            out["parentSpanId"] = f"{s.parent_span_id:016x}"
        out.update({"name": s.name, "kind": 1, "startTimeUnixNano": str(s.start_ns),
                    "endTimeUnixNano": str(s.end_ns), "attributes": attributes(s.attributes),
                    "status": {} if s.error is None else {"message": s.error, "code": 2}, "flags": 256})
        return out

    scope = {"name": SCOPE.name, "version": SCOPE.version}
    data = {"resourceSpans": [{"resource": {"attributes": attributes(dict(RESOURCE.attributes))},
                               "scopeSpans": [{"scope": scope, "spans": [span(s) for s in spans]}]}]}
    return json.dumps(data, separators=(",", ":"))


def test_the_local_copy_line_is_byte_identical_to_the_json_mapping() -> None:
    spans = _spans()
    expected = _reference_json(spans)
    assert traces_data_json(spans, RESOURCE, SCOPE) == expected
    assert traces_data_json(spans, RESOURCE, SCOPE) == expected  # with every cache warm
