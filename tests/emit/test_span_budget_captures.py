"""The span budget keeps every step around a deep capture: the emitter's own trigger, the rank's capture
status (a capture asked for elsewhere), and the capture's summary (which steps it took)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from traceml_otel import contract as c
from traceml_otel.emit.emitter import Emitter
from traceml_otel.emit.span_budget import CAPTURE_KEEP_MAX_STEPS, PLAIN, BudgetSettings, SpanBudget
from traceml_otel.emit.step_protobuf import EncodedStep
from traceml_otel.wire.capture_record import CaptureSummary, status_file_name, write_summary
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.sampling_threshold import in_sample, threshold
from traceml_otel.wire.step_row import PhaseRow, StepRow

MS = 1_000_000
RUN = "captures"
SPIKES = (100, 150, 200)
"""Periodic spikes: the third makes the emitter's trigger ask for a capture of the next one (step 249)."""
BATCH = 32


def _rows(first: int, count: int) -> list[StepRow]:
    """Steps whose forward fills them (no residual for the residual trigger: only the spikes ask)."""
    rows = []
    for step in range(first, first + count):
        start = step * 30 * MS
        busy = 25 * MS if step in SPIKES else 2 * MS
        rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + busy, optimizer_steps=1,
                               phases=[PhaseRow.timed("forward", None, start, start + busy, None)]))
    return rows


def _status(run_dir: Path, started: int, request: str, refusal: str = "") -> None:
    """The rank's capture status as the trainer's poller writes it when it takes (or refuses) a request."""
    record = {"version": 1, "rank": 0, "started": started, "refused": {}, "last_request": request,
              "last_reason": "spike", "last_refusal": refusal, "limits": {}, "budget": {}}
    (run_dir / status_file_name(0)).write_text(json.dumps(record))


def _in_sample(step: int) -> bool:
    return in_sample(c.step_trace_id(RUN, step), threshold(0.1))


@pytest.fixture
def emitter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Emitter, dict[int, bool]]]:
    for name in ("TRACEML_CAPTURE", "TRACEML_CAPTURE_AUTO", "TRACEML_CAPTURE_INTERVAL_S",
                 "TRACEML_CAPTURE_MAX"):
        monkeypatch.delenv(name, raising=False)
    hello = Hello(run_id=RUN, rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                  anchor_ns=time.time_ns(), shutdown_timeout_s=1.0, run_dir=str(tmp_path),
                  traces_endpoint="http://127.0.0.1:9", traces_protocol="http/protobuf",
                  otlp_spans="sampled", otlp_sample_rate=0.1, otlp_span_budget=0.0)
    emitter = Emitter(hello)
    assert emitter.budget is not None and emitter.capture_triggers is not None
    kept: dict[int, bool] = {}
    decide = emitter.budget.decide

    def watched(records, trace_ids, spans):  # the real decisions, noted per step
        decisions = decide(records, trace_ids, spans)
        kept.update((r.step, d is not None) for r, d in zip(records, decisions or [], strict=True))
        return decisions

    emitter.budget.decide = watched  # type: ignore[method-assign]
    assert emitter.shipper is not None
    offer = emitter.shipper.offer_steps

    def encoded_when_kept(steps, decisions=None):  # a step's protobuf is built only when it is kept
        for step, decision in zip(steps, decisions or [PLAIN] * len(steps), strict=True):
            if type(step) is EncodedStep:
                assert step.pending is None
                assert len(step.encoded) == (step.count if decision is not None else 0)
                filled[decision is not None] += 1
        return offer(steps, decisions)

    filled = {True: 0, False: 0}
    emitter.shipper.offer_steps = encoded_when_kept  # type: ignore[method-assign]
    yield emitter, kept
    assert filled[True] > 0 and filled[False] > filled[True]  # templated steps, kept and dropped
    emitter.finish("ok", 0, True)


def _feed(emitter: Emitter, first: int, last: int) -> None:
    for start in range(first, last, BATCH):
        emitter.handle_steps(json.loads(json.dumps(_rows(start, min(BATCH, last - start)))))  # as sent
        while emitter.has_export_work:
            emitter.export_next()


def test_steps_around_captures_are_kept_under_the_budget(emitter, tmp_path: Path) -> None:
    emitter, kept = emitter
    _feed(emitter, 0, 224)  # the second spike (step 150), alike the first, fires it (judged at step 151)
    (request,) = emitter.capture_triggers.fired
    assert request.reason == "spike" and request.at_step == 199
    _status(tmp_path, 1, request.id)  # the poller took it
    _feed(emitter, 224, 288)
    write_summary(tmp_path, CaptureSummary(run_id=RUN, rank=0, index=1, reason="spike", request_id=request.id,
                                           steps=(199, 200, 201), finished_unix=time.time()))
    emitter.poll_hang(force=True)  # the summary's capture span: the steps it took
    _feed(emitter, 288, 416)
    _status(tmp_path, 2, "http-r0-1")  # an on-demand capture the emitter did not ask for
    _feed(emitter, 416, 448)
    write_summary(tmp_path, CaptureSummary(run_id=RUN, rank=0, index=2, reason="on_demand",
                                           steps=(420, 421), finished_unix=time.time()))
    emitter.poll_hang(force=True)
    _feed(emitter, 448, 600)

    assert len(kept) == 600
    # The trigger's capture: every step from the one before it may start to the one after the last
    # captured step, kept on this rank whatever the sample says.
    assert all(kept[step] for step in range(198, 203))
    assert not all(_in_sample(step) for step in range(198, 203))  # the sample alone would drop some
    # The on-demand capture, known from the status: its batch on, to the step after its last one.
    assert all(kept[step] for step in range(416, 423))
    assert all(kept[step] for step in SPIKES)
    # Elsewhere the sample decides again (the spikes and the first, warm-up steps aside).
    later = [step for step in range(300, 600) if not 416 <= step < 448]
    assert [step for step in later if kept[step]] == [step for step in later if _in_sample(step)]
    assert emitter.shipper is not None and emitter.shipper.counts.budget_dropped > 0  # counted, not lost


def test_a_refused_request_keeps_nothing_and_a_capture_without_summary_stops_at_the_cap() -> None:
    budget = SpanBudget(BudgetSettings("sampled", 0.1, 0.0), world_size=1)

    def decide(first: int, count: int) -> list[bool]:
        from traceml_otel.step_records import StepRecord
        records = [StepRecord(step=s, start_ns=10**18 + s * MS, end_ns=10**18 + s * MS + MS // 2, phases=())
                   for s in range(first, first + count)]
        decided = budget.decide(records, [c.step_trace_id(RUN, r.step) for r in records], [1] * count)
        return [d is not None for d in decided or []]

    decide(0, 100)
    budget.capture_pending(150)
    budget.capture_refused()
    assert decide(100, 100) == [_in_sample(step) for step in range(100, 200)]
    budget.capture_pending(200)  # never summarised: kept up to the cap, then sampled again
    got = decide(200, CAPTURE_KEEP_MAX_STEPS + 200)
    assert all(got[:CAPTURE_KEEP_MAX_STEPS])
    tail = range(200 + CAPTURE_KEEP_MAX_STEPS, 400 + CAPTURE_KEEP_MAX_STEPS)
    assert got[CAPTURE_KEEP_MAX_STEPS:] == [_in_sample(step) for step in tail]
