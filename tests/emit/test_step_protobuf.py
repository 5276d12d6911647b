"""OTLP export's fast path: a templated step's protobuf is the span encoder's bytes for its spans."""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tests.emit.test_step_lines import ANCHOR, RANK, _record, _row
from traceml_otel.emit.otlp_encode import SpanEncoder
from traceml_otel.emit.span_budget import Kept, KeptEncoder
from traceml_otel.emit.spans import StepSpanBuilder, StepSpans
from traceml_otel.emit.step_lines import StepLines
from traceml_otel.emit.step_protobuf import EncodedStep, fill_kept
from traceml_otel.emit.step_run import resolve_records
from traceml_otel.wire.step_row import decode_step

ENCODER = SpanEncoder(Resource.create({"service.name": "t"}), InstrumentationScope("traceml_otel", "9"))


def _reference(rows: list[list[object]], seed: int) -> list[StepSpans]:
    builder = StepSpanBuilder(RANK)
    builder._random.seed(seed)
    return [builder.build(decode_step(row, ANCHOR)) for row in rows]


def _fast(rows: list[list[object]], seed: int, batch: int, otlp: bool = True,
          ) -> tuple[list[StepSpans | EncodedStep], StepLines]:
    builder = StepSpanBuilder(RANK)
    builder._random.seed(seed)
    lines = StepLines(builder)
    lines.otlp = ENCODER if otlp else None
    built: list[StepSpans | EncodedStep] = []
    for first in range(0, len(rows), batch):
        encoded = lines.encode(rows[first:first + batch], ANCHOR, keep_spans=True)
        records = resolve_records(encoded.records, encoded.built)  # (a run's: decoded)
        assert [record.step for record in records] == [decode_step(row, ANCHOR).step
                                                       for row in rows[first:first + batch]]
        built += encoded.built
    return built, lines


@pytest.mark.parametrize("batch", [64, 7])
def test_templated_steps_are_the_encoders_bytes_for_the_reference_spans(batch: int) -> None:
    """Thousands of random rows of many shapes (GPU timelines, repeated phases, H2D bytes, odd
    strings): every step's OTLP fields, ids and span count are the reference spans' own."""
    values = random.Random(3)
    rows = [_row(_record(step, random.Random(step // 29 % 40), values)) for step in range(3000)]
    fast, _ = _fast(rows, seed=4, batch=batch)
    reference = _reference(rows, seed=4)
    templated = 0
    for got, want in zip(fast, reference, strict=True):
        assert (got.trace_id, got.span_id, got.count) == (want.trace_id, want.span_id, want.count)
        if type(got) is EncodedStep:
            templated += 1
            assert list(got.encoded) == [ENCODER.encode(span) for span in want.all()]
            assert got.collectives == ()
        else:
            assert got == want
    assert templated > 0.9 * len(rows)
    request = ExportTraceServiceRequest.FromString(
        ENCODER.request([field for step in fast if type(step) is EncodedStep for field in step.encoded]))
    assert len(request.resource_spans[0].scope_spans[0].spans) == sum(
        step.count for step in fast if type(step) is EncodedStep)


def test_without_otlp_export_templated_steps_carry_ids_only() -> None:
    """Metrics alone need each step's ids, not its spans: no protobuf is made."""
    values = random.Random(5)
    rows = [_row(_record(step, random.Random(step // 50 % 4), values)) for step in range(400)]
    fast, _ = _fast(rows, seed=6, batch=64, otlp=False)
    reference = _reference(rows, seed=6)
    assert any(type(step) is EncodedStep for step in fast)
    for got, want in zip(fast, reference, strict=True):
        assert (got.trace_id, got.span_id, got.count) == (want.trace_id, want.span_id, want.count)
        if type(got) is EncodedStep:
            assert got.encoded == ()


def test_under_the_budget_only_kept_steps_are_filled_with_the_encoders_bytes() -> None:
    """With the span budget on, a templated step's protobuf waits for the decision: the kept steps get
    the encoder's bytes for their spans (any subset of a run, in any batch), the dropped ones none."""
    values = random.Random(11)
    rows = [_row(_record(step, random.Random(step // 40 % 6), values)) for step in range(800)]
    builder = StepSpanBuilder(RANK)
    builder._random.seed(12)
    lines = StepLines(builder)
    lines.otlp = ENCODER
    lines.defer_protobuf = True
    reference = _reference(rows, seed=12)
    choose = random.Random(13)
    kept_steps = dropped = 0
    for first in range(0, len(rows), 64):
        built = lines.encode(rows[first:first + 64], ANCHOR, keep_spans=True).built
        deferred = [step for step in built if type(step) is EncodedStep]
        assert deferred and all(step.pending is not None and step.encoded == () for step in deferred)
        decisions = [Kept("", "") if choose.random() < 0.2 else None for _ in built]
        fill_kept(built, decisions)
        for got, want, decision in zip(built, reference[first:first + 64], decisions, strict=True):
            if type(got) is not EncodedStep:
                continue
            assert got.pending is None
            if decision is None:
                assert got.encoded == ()
                dropped += 1
            else:
                assert list(got.encoded) == [ENCODER.encode(span) for span in want.all()]
                kept_steps += 1
    assert kept_steps > 100 and dropped > 4 * kept_steps // 2
    built = lines.encode(rows[:64], ANCHOR, keep_spans=True).built
    fill_kept(built, None)  # no decisions: the budget kept every step
    assert all(len(step.encoded) == step.count for step in built if type(step) is EncodedStep)


def test_a_kept_steps_tracestate_spliced_into_encoded_spans_is_the_encoders() -> None:
    """The span budget's tracestate and threshold attribute on spans encoded ahead: the same bytes as
    encoding the span objects with them."""
    values = random.Random(7)
    rows = [_row(_record(step, random.Random(step % 12), values)) for step in range(600)]
    fast, _ = _fast(rows, seed=8, batch=64)
    reference = _reference(rows, seed=8)
    kept_encoder = KeptEncoder(ENCODER)
    for kept in (Kept("ot=th:0;rv:0123456789abcd", "0"), Kept("ot=th:e666;rv:" + "f" * 14, "e666")):
        checked = 0
        for got, want in zip(fast, reference, strict=True):
            if type(got) is EncodedStep:
                assert kept_encoder(got, kept) == kept_encoder(want.all(), kept)
                checked += 1
        assert checked > 500
    with pytest.raises(ValueError):
        ENCODER.with_trace_state(ENCODER.encode(reference[0].step.__class__(
            "s", 1, 2, None, 3, 4, {}, error="boom")), b"")


def test_the_ratio_sampler_keeps_the_same_encoded_steps_as_span_objects() -> None:
    """``OTEL_TRACES_SAMPLER=traceidratio`` decides on the step's trace id, encoded ahead or not, and the
    shipper sends the same bytes either way."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from traceml_otel.emit.otlp_encode import EncodedSpans
    from traceml_otel.emit.span_export import OtlpSpanShipper, sampler_from_settings

    class Collect:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def export(self, batch: EncodedSpans) -> SpanExportResult:
            self.sent += list(batch)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    values = random.Random(9)
    rows = [_row(_record(step, random.Random(step // 64 % 3), values)) for step in range(512)]
    fast, _ = _fast(rows, seed=10, batch=64)
    reference = _reference(rows, seed=10)
    outcomes = []
    for steps in ([s if type(s) is EncodedStep else s.all() for s in fast], [s.all() for s in reference]):
        exporter = Collect()
        shipper = OtlpSpanShipper(exporter, sampler_from_settings("parentbased_traceidratio", "0.5"),  # type: ignore[arg-type]
                                  "x", ENCODER.encode, batch=lambda spans: EncodedSpans(ENCODER, spans))
        kept = shipper.offer_steps(steps)
        counts = shipper.close(10.0)
        assert counts.exported + counts.sampled_out == sum(step.count for step in reference)
        outcomes.append((kept, exporter.sent))
    assert outcomes[0] == outcomes[1]
    assert 150 < sum(outcomes[0][0]) < 362  # about half
