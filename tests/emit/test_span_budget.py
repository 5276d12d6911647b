"""The OTLP span budget: consistent decisions across ranks, anomalies kept, the threshold in standard form."""

from __future__ import annotations

import random

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from traceml_otel import contract as c
from traceml_otel.emit.otlp_encode import SpanEncoder
from traceml_otel.emit.span_budget import PLAIN, BudgetSettings, KeptEncoder, SpanBudget
from traceml_otel.emit.span_export import ALWAYS_ON, OtlpSpanShipper
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, StepSpanBuilder
from traceml_otel.step_records import PhaseTiming, StepRecord
from traceml_otel.wire.sampling_threshold import (
    adjusted_count,
    in_sample,
    threshold,
    threshold_hex,
    trace_state_threshold,
)

MS = 1_000_000


def _records(steps: int, slow: set[int], seed: int, step_ms: float = 10.0) -> list[StepRecord]:
    """A rank's steps of ~``step_ms`` with some noise, and ``slow`` steps 10 times longer."""
    rng = random.Random(seed)
    out, t = [], 10**18  # a start of 0 is a field proto3 leaves out
    for step in range(steps):
        duration = int(step_ms * MS * (10 if step in slow else rng.uniform(0.9, 1.1)))
        out.append(StepRecord(step=step, start_ns=t, end_ns=t + duration,
                              phases=(PhaseTiming("forward", 0, t, t + duration // 2),)))
        t += duration + MS
    return out


def _decide(budget: SpanBudget, records: list[StepRecord], run_id: str, spans: int = 2,
            batch: int = 200) -> list[object]:
    out: list[object] = []
    for i in range(0, len(records), batch):
        chunk = records[i:i + batch]
        decided = budget.decide(chunk, [c.step_trace_id(run_id, r.step) for r in chunk], [spans] * len(chunk))
        out.extend([PLAIN] * len(chunk) if decided is None else decided)
    return out


def test_threshold_in_the_specs_form() -> None:
    assert threshold_hex(threshold(1.0)) == "0"
    assert threshold_hex(threshold(0.5)) == "8"
    assert threshold_hex(threshold(0.25)) == "c"
    assert threshold_hex(threshold(0.1)) == "e6666666666666"
    assert abs(adjusted_count(threshold_hex(threshold(0.1))) - 10.0) < 1e-9
    assert adjusted_count("8") == 2.0 and adjusted_count("0") == 1.0
    assert adjusted_count("zz") is None and adjusted_count("0" * 15) is None
    assert trace_state_threshold("vendor=x,ot=th:c;rv:0123456789abcd") == "c"
    assert trace_state_threshold("vendor=x") is None
    assert in_sample(0xFF << 48, threshold(0.5)) and not in_sample(0x7F << 48, threshold(0.5))


def test_ranks_keep_the_same_steps_and_every_slow_one() -> None:
    run_id = "budget-run"
    slow = {37, 400, 1234, 2999}
    settings = BudgetSettings("sampled", 0.1, 0.0)  # a fixed rate, no budget
    kept_by_rank = []
    for rank in (0, 1):
        budget = SpanBudget(settings, world_size=2)
        decisions = _decide(budget, _records(3000, slow, seed=rank), run_id)
        sampled = {step for step, d in enumerate(decisions) if d is not None and d.th != "0"}
        certain = {step for step, d in enumerate(decisions) if d is not None and d.th == "0"}
        assert slow <= certain  # the planted slow steps: kept with certainty (weight 1), sampled or not
        kept_by_rank.append((sampled, certain))
        for step, d in enumerate(decisions):
            if d is not None:
                rv = f"{c.step_trace_id(run_id, step) & ((1 << 56) - 1):014x}"
                assert d.trace_state == f"ot=th:{d.th};rv:{rv}"
    (sampled0, certain0), (sampled1, certain1) = kept_by_rank
    expected = {s for s in range(3000) if in_sample(c.step_trace_id(run_id, s), threshold(0.1))}
    assert sampled0 | (certain0 & expected) == expected  # the consistent sample, all of it
    assert sampled0 | (certain0 & expected) == sampled1 | (certain1 & expected)  # same steps, both ranks
    assert 0.07 * 3000 < len(expected) < 0.13 * 3000
    assert len(certain0) < 0.05 * 3000  # anomalies stay a few per cent (window records, slow steps)


def test_the_budget_holds_at_1024_ranks() -> None:
    """1,024 ranks at 2 steps/s and 6 spans a step is 12,288 spans/s; the budget is 5,000."""
    budget = SpanBudget(BudgetSettings("auto", None, 5000.0), world_size=1024)
    records = _records(2048, set(), seed=3, step_ms=499.0)
    decisions = _decide(budget, records, "fleet", spans=6)
    later = decisions[256:]  # after the first epochs measured the rate
    kept = sum(d is not None for d in later)
    spans_per_s = 1024 * 6 * kept / len(later) * 2.0
    assert spans_per_s <= 5000
    assert budget.probability == 0.25 and budget.lowest_probability == 0.25
    assert decisions[0] is PLAIN  # the first epoch sends everything (the rate is not known yet)


def test_auto_under_the_budget_writes_nothing() -> None:
    budget = SpanBudget(BudgetSettings("auto", None, 5000.0), world_size=2)
    records = _records(500, {100}, seed=1)
    assert all(budget.decide([r], [c.step_trace_id("x", r.step)], [2]) is None for r in records)
    assert budget.probability == 1.0


def test_kept_spans_encode_as_the_sdk_with_the_tracestate() -> None:
    resource, scope = Resource.create({"service.name": "t"}), InstrumentationScope("traceml_otel", "1")
    builder = StepSpanBuilder(RankInfo("run", 0, 0, 2, 0, "h"))
    spans = builder.build(_records(1, set(), seed=0)[0]).all()
    budget = SpanBudget(BudgetSettings("sampled", 0.5, 0.0), world_size=2)
    (kept,) = budget.decide(_records(1, set(), 0), [spans[0].trace_id], [len(spans)])
    kept = kept or type(PLAIN)("ot=th:8;rv:00000000000000", "8")
    encoder = SpanEncoder(resource, scope)
    ours = encoder.request(KeptEncoder(encoder)(spans, kept))
    factory = ReadableSpanFactory(resource, scope)
    state = TraceState([("ot", kept.trace_state.removeprefix("ot="))])
    reference = []
    for index, span in enumerate(spans):
        sdk = factory.convert(span)
        attributes = dict(sdk.attributes)
        if index == 0:
            attributes[c.ATTR_SAMPLING_THRESHOLD] = kept.th
        context = SpanContext(span.trace_id, span.span_id, False, TraceFlags(TraceFlags.SAMPLED), state)
        reference.append(ReadableSpan(
            name=sdk.name, context=context, parent=sdk.parent, resource=resource, attributes=attributes,
            kind=sdk.kind, instrumentation_scope=scope, status=sdk.status, start_time=sdk.start_time,
            end_time=sdk.end_time))
    assert ours == encode_spans(reference).SerializeToString()


class _Exporter:
    def __init__(self) -> None:
        self.batches: list[list[object]] = []

    def export(self, batch: list[object]) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult
        self.batches.append(list(batch))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_the_shipper_counts_budget_drops_apart_from_loss() -> None:
    builder = StepSpanBuilder(RankInfo("run", 0, 0, 2, 0, "h"))
    steps = [builder.build(r).all() for r in _records(4, set(), seed=0)]
    exporter = _Exporter()
    shipper = OtlpSpanShipper(exporter, ALWAYS_ON, "http://127.0.0.1:1", lambda s: s,  # type: ignore[arg-type]
                              convert_kept=lambda spans, kept: [(kept.th, s) for s in spans])
    kept = type(PLAIN)("ot=th:8;rv:00000000000000", "8")
    sent = shipper.offer_steps(steps, [None, kept, PLAIN, None])
    counts = shipper.close(10.0)
    assert sent == [False, True, True, False]
    assert counts.budget_dropped == len(steps[0]) + len(steps[3])
    assert counts.exported == len(steps[1]) + len(steps[2]) and counts.dropped == 0
    (batch,) = exporter.batches
    assert batch[:len(steps[1])] == [("8", s) for s in steps[1]] and batch[len(steps[1]):] == steps[2]


def test_the_account_shows_kept_dropped_by_budget_and_lost_apart(tmp_path) -> None:
    from traceml_otel.launch.export_report import render_export_report
    from traceml_otel.wire.export_stats import ExportStats

    stats = [ExportStats(run_id="r", rank=rank, otlp_endpoint="http://127.0.0.1:4317", otlp_exported=90,
                         otlp_budget_dropped=800, otlp_dropped=10, otlp_sample_probability=0.125,
                         otlp_drop_reasons={"export failed": 10}, final=True, clean_shutdown=True)
             for rank in (0, 1)]
    text = render_export_report(tmp_path, stats)
    assert "200 spans kept, 1600 dropped by the span budget (sampling by design, not loss" in text
    assert "20 lost; lowest sample probability 0.125" in text
    assert "1600 not delivered" not in text and "180 spans delivered, 20 not delivered" in text
