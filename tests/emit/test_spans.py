"""Records become spans with the contract's names, parents, attributes and timeline."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tests.local_copy_reader import parse_line
from traceml_otel import contract as c
from traceml_otel.emit.local_copy import traces_data_json
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, StepSpanBuilder
from traceml_otel.step_records import PhaseTiming, StepRecord

MS = 1_000_000
RESOURCE = Resource.create({"service.name": "t", "note": "quote \" and \u00e9"})
SCOPE = InstrumentationScope("traceml_otel", "9.9")


def _builder(rank: int = 0) -> StepSpanBuilder:
    info = RankInfo(run_id="run-1", rank=rank, local_rank=rank, world_size=2, node_rank=0, host="h")
    return StepSpanBuilder(info)


def _cpu_record(step: int = 7) -> StepRecord:
    return StepRecord(
        step=step, start_ns=1_000 * MS, end_ns=1_010 * MS, input_wait_ns=2 * MS, input_fetches=1,
        phases=(
            PhaseTiming("forward", 0, 1_001 * MS, 1_004 * MS),
            PhaseTiming("backward", 0, 1_004 * MS, 1_008 * MS),
            PhaseTiming("optimizer", 0, 1_008 * MS, 1_009 * MS),
        ),
        optimizer_steps=1,
    )


def test_step_span_is_a_root_with_children_in_the_derived_trace() -> None:
    spans = _builder().build(_cpu_record())
    step = spans.step
    assert step.name == c.SPAN_STEP and step.parent_span_id is None
    assert step.trace_id == c.step_trace_id("run-1", 7)
    assert [s.name for s in spans.phases] == ["traceml.forward", "traceml.backward", "traceml.optimizer"]
    for child in spans.phases:
        assert child.parent_span_id == step.span_id
        assert child.trace_id == step.trace_id
        assert step.start_ns <= child.start_ns <= child.end_ns <= step.end_ns
    attributes = step.attributes
    assert attributes[c.ATTR_RUN_ID] == "run-1" and attributes[c.ATTR_STEP] == 7
    assert attributes[c.ATTR_RANK] == 0 and attributes[c.ATTR_WORLD_SIZE] == 2
    assert attributes[c.ATTR_CLOCK] == "cpu"
    assert abs(attributes[c.ATTR_STEP_CPU_DURATION] - 0.010) < 1e-9
    assert abs(attributes[c.ATTR_INPUT_WAIT_CPU] - 0.002) < 1e-9
    assert c.ATTR_STEP_GPU_DURATION not in attributes and c.ATTR_MEM_PEAK_RESERVED not in attributes
    forward = spans.phases[0].attributes
    assert forward[c.ATTR_PHASE_NAME] == "forward" and forward[c.ATTR_PHASE_CALL] == 0
    assert abs(forward[c.ATTR_PHASE_CPU_DURATION] - 0.003) < 1e-9


def test_every_rank_puts_step_n_in_the_same_trace() -> None:
    a, b = _builder(0).build(_cpu_record(3)), _builder(1).build(_cpu_record(3))
    assert a.step.trace_id == b.step.trace_id
    assert a.step.span_id != b.step.span_id
    assert _builder(0).build(_cpu_record(4)).step.trace_id != a.step.trace_id


def test_gpu_children_sit_on_the_gpu_timeline() -> None:
    record = StepRecord(
        step=1, start_ns=1_000 * MS, end_ns=1_002 * MS, gpu_duration_ns=20 * MS,
        phases=(
            PhaseTiming("forward", 0, 1_000 * MS, 1_001 * MS, gpu_offset_ns=5 * MS, gpu_duration_ns=10 * MS),
        ),
        peak_allocated_bytes=10, peak_reserved_bytes=20, device_total_bytes=100,
    )
    spans = _builder().build(record)
    (forward,) = spans.phases
    assert forward.start_ns == 1_005 * MS and forward.end_ns == 1_015 * MS
    assert spans.step.end_ns == 1_020 * MS  # the step stretches over its GPU work
    assert spans.step.attributes[c.ATTR_CLOCK] == "gpu"
    assert forward.attributes[c.ATTR_PHASE_GPU_DURATION] == 0.010
    assert abs(forward.attributes[c.ATTR_PHASE_CPU_DURATION] - 0.001) < 1e-9
    assert spans.step.attributes[c.ATTR_MEM_PEAK_RESERVED] == 20


def test_failed_step_has_error_status() -> None:
    record = StepRecord(step=0, start_ns=1, end_ns=2, exception_type="ValueError")
    step = _builder().build(record).step
    assert step.error == "ValueError"
    assert ReadableSpanFactory(RESOURCE, SCOPE).convert(step).status.status_code.name == "ERROR"
    assert step.attributes["exception.type"] == "ValueError"


def test_local_copy_line_is_otlp_json_with_hex_ids() -> None:
    spans = _builder().build(_cpu_record()).all()
    data = parse_line(traces_data_json(spans, RESOURCE, SCOPE))
    parsed = data.resource_spans[0].scope_spans[0].spans
    assert len(parsed) == 4
    assert parsed[0].trace_id.hex() == f"{c.step_trace_id('run-1', 7):032x}"
    assert parsed[1].parent_span_id == parsed[0].span_id


def test_hand_encoder_matches_the_sdk_encoder_field_for_field() -> None:
    """Our OTLP JSON equals the SDK protobuf encoder's output mapped to JSON with hex ids."""
    import base64
    import json

    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    gpu_record = StepRecord(
        step=2, start_ns=5 * MS, end_ns=9 * MS, gpu_duration_ns=6 * MS, exception_type="OSError",
        phases=(PhaseTiming("h2d", 0, 5 * MS, 6 * MS, gpu_offset_ns=0, gpu_duration_ns=MS, nbytes=4096),),
        peak_allocated_bytes=2**40, peak_reserved_bytes=2**41, device_total_bytes=2**42,
    )
    spans = [*_builder().build(_cpu_record()).all(), *_builder().build(gpu_record).all()]
    factory = ReadableSpanFactory(RESOURCE, SCOPE)
    expected = json_format.MessageToDict(encode_spans([factory.convert(s) for s in spans]),
                                         use_integers_for_enums=True)
    for resource_spans in expected["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    assert json.loads(traces_data_json(spans, RESOURCE, SCOPE)) == expected


def test_ratio_sampler_decides_alike_on_every_rank_and_counts_what_it_skips() -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from traceml_otel.emit.span_export import OtlpSpanShipper, sampler_from_settings

    class Collect(SpanExporter):
        def __init__(self) -> None:
            self.trace_ids: set[int] = set()

        def export(self, spans):
            self.trace_ids.update(span.context.trace_id for span in spans)
            return SpanExportResult.SUCCESS

    kept = []
    for rank in (0, 1):
        exporter = Collect()
        shipper = OtlpSpanShipper(exporter, sampler_from_settings("parentbased_traceidratio", "0.5"), "x",
                                  ReadableSpanFactory(RESOURCE, SCOPE).convert)
        for step in range(200):
            shipper.offer(_builder(rank).build(_cpu_record(step)).all())
        counts = shipper.close(timeout_s=10)
        assert counts.exported + counts.sampled_out == 200 * 4 and counts.dropped == 0
        kept.append(exporter.trace_ids)
    assert kept[0] == kept[1]  # the same steps on both ranks
    assert 60 < len(kept[0]) < 140  # about half
