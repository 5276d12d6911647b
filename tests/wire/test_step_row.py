"""The step row: named slots that are a plain JSON list on the wire, and rows of every length decode."""

from __future__ import annotations

import json

import pytest

from traceml_otel.capture.device_clock import CpuClock
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.step_records import LoaderSettings
from traceml_otel.wire.frames import FrameBuffer, WireError, encode_frame
from traceml_otel.wire.step_row import (
    APPENDED_DEFAULTS,
    FIRST_LAYOUT_FIELDS,
    ROW_FIELDS,
    CollectiveRow,
    PhaseRow,
    StepRow,
    calls_in_order,
    decode_step,
)

STEP_FIELDS = ("step", "start_ns", "end_ns", "gpu_duration_ns", "input_wait_ns", "input_wait_gpu_ns",
               "input_fetches", "prefetch_h2d_ns", "optimizer_steps", "parallelism", "peak_allocated_bytes",
               "peak_reserved_bytes", "device_total_bytes", "exception_type", "phases", "collectives",
               "samples", "tokens", "loader", "source", "between_ns", "input_wait_in_step_ns",
               "skipped_updates")
"""The wire layout, slot by slot: fields are only ever appended to this list."""


def test_each_keyword_lands_in_the_slot_of_the_same_name() -> None:
    assert len(STEP_FIELDS) == ROW_FIELDS and len(APPENDED_DEFAULTS) == ROW_FIELDS - FIRST_LAYOUT_FIELDS
    row = StepRow.of(**{name: f"<{name}>" for name in STEP_FIELDS})
    assert row == [f"<{name}>" for name in STEP_FIELDS]  # the keyword order is the wire order
    for name in STEP_FIELDS:
        assert getattr(row, name) == f"<{name}>"
        setattr(row, name, name)
    assert row == list(STEP_FIELDS)
    phase = PhaseRow.timed("forward", 2, 10, 20, 64)
    phase.gpu_offset_ns, phase.gpu_duration_ns = 3, 4
    assert phase == ["forward", 2, 10, 20, 3, 4, 64]
    assert (phase.phase, phase.call, phase.start_ns, phase.end_ns, phase.nbytes) == ("forward", 2, 10, 20, 64)
    collective = CollectiveRow.started(kind="all_reduce", source="ddp", start_ns=5, nbytes=8, blocking=False)
    collective.end_ns, collective.gpu_offset_ns, collective.gpu_duration_ns = 9, 1, 2
    assert collective == ["all_reduce", "ddp", 5, 9, 8, False, 1, 2]


def test_a_row_is_the_same_compact_json_list_as_before() -> None:
    phase = PhaseRow.timed("forward", 0, 11, 12, None)
    row = StepRow.of(step=3, start_ns=10, end_ns=20, input_wait_ns=5, input_fetches=1,
                   optimizer_steps=1, phases=[phase], samples=8)
    plain = [3, 10, 20, None, 5, None, 1, None, 1, "none", None, None, None, None,
             [["forward", 0, 11, 12, None, None, None]], [], 8, None, None, None, None, None, 0]
    assert encode_frame({"t": "steps", "s": [row]}) == encode_frame({"t": "steps", "s": [plain]})
    assert json.dumps(row, separators=(",", ":")) == json.dumps(plain, separators=(",", ":"))


def test_every_value_the_recorder_puts_in_a_row_arrives_in_its_slot() -> None:
    class FrameSink:
        def __init__(self) -> None:
            self.buffer = FrameBuffer()

        def send_steps(self, rows: list[StepRow]) -> None:
            self.buffer.feed(encode_frame({"t": "steps", "s": rows}))

    class MemoryClock(CpuClock):
        def peak_memory(self) -> tuple[int, int, int]:
            return 11, 22, 33

    sink = FrameSink()
    recorder = StepRecorder(sink, MemoryClock(), flush_steps=1)
    recorder.parallelism = "ddp"
    recorder.add_prefetch_h2d(7)
    token = recorder.fetch_begin()
    recorder.fetch_end(token, samples=4)
    recorder.loader_seen((2, False, False, 2, 4))
    recorder.begin_step(tokens=128)
    recorder.phase_end("forward", recorder.phase_begin())
    recorder.phase_end("h2d", recorder.phase_begin(), nbytes=1024)
    recorder.optimizer_stepped()
    collective = recorder.collective_begin("all_reduce", "api", 4096, True)
    assert collective is not None
    recorder.collective_end(collective)
    recorder.end_step("ValueError")
    recorder.source = "inferred"
    recorder.begin_step()
    recorder.end_step()
    frame = sink.buffer.next_frame()
    second = sink.buffer.next_frame()
    assert second is not None
    (later,) = [decode_step(row, anchor_ns=1_000) for row in second["s"]]
    assert later.source == "inferred" and later.between_steps_ns is not None and later.between_steps_ns >= 0
    assert frame is not None
    (record,) = [decode_step(row, anchor_ns=1_000) for row in frame["s"]]
    assert (record.step, record.samples, record.tokens, record.input_fetches, record.optimizer_steps) == (
        0, 4, 128, 1, 1)
    assert record.source == "trace_step" and record.between_steps_ns is None  # a rank's first step
    assert record.exception_type == "ValueError" and record.loader == LoaderSettings(2, False, False, 2, 4)
    assert (record.parallelism, record.prefetch_h2d_ns, record.input_wait_gpu_ns) == ("ddp", 7, None)
    memory = (record.peak_allocated_bytes, record.peak_reserved_bytes, record.device_total_bytes)
    assert memory == (11, 22, 33)
    assert record.input_wait_ns is not None and record.input_wait_ns >= 0
    assert [(p.phase, p.call, p.nbytes) for p in record.phases] == [("forward", 0, None), ("h2d", 0, 1024)]
    (timed,) = record.collectives
    assert (timed.kind, timed.source, timed.nbytes, timed.blocking) == ("all_reduce", "api", 4096, True)
    assert record.start_ns < timed.start_ns <= timed.end_ns <= record.end_ns  # all moved by the anchor
    assert record.start_ns > 1_000 and record.gpu_duration_ns is None  # CPU clock: no device timings


def test_older_shorter_and_newer_longer_rows_still_decode() -> None:
    full = StepRow.of(step=1, start_ns=10, end_ns=30, samples=2, tokens=3,
                    loader=[0, False, False, None, 2])
    first_layout = full[:FIRST_LAYOUT_FIELDS]
    record = decode_step(first_layout, 0)
    assert (record.collectives, record.samples, record.tokens, record.loader) == ((), None, None, None)
    assert decode_step(full[:17], 0).samples == 2 and decode_step(full[:17], 0).tokens is None
    longer = decode_step([*full, "a slot a newer capture side appended"], 0)
    assert longer == decode_step(full, 0) and longer.loader == LoaderSettings(0, False, False, None, 2)
    with pytest.raises(WireError):
        decode_step(first_layout[:-1], 0)
    with pytest.raises(WireError):
        decode_step({"step": 1}, 0)  # type: ignore[arg-type]


def test_decode_step_puts_every_slot_in_the_field_of_its_name() -> None:
    """``decode_step`` unpacks rows positionally (it is the emitter's per-step cost): each slot,
    given a value no other slot has, must land in the record field of the same name."""
    from traceml_otel.step_records import CollectiveTiming, PhaseTiming, StepRecord

    phase = ["backward", 2, 40, 50, 3, 4, 5]
    collective = ["all_reduce", "ddp", 41, 49, 6, True, 7, 8]
    row = StepRow.of(step=1, start_ns=10, end_ns=90, gpu_duration_ns=11, input_wait_ns=12,
                     input_wait_gpu_ns=13, input_fetches=14, prefetch_h2d_ns=15, optimizer_steps=16,
                     parallelism="ddp", peak_allocated_bytes=17, peak_reserved_bytes=18,
                     device_total_bytes=19, exception_type="E", phases=[phase], collectives=[collective],
                     samples=20, tokens=21, loader=[1, True, False, 2, 22, "D"], source="inferred",
                     between_ns=23)
    expected = StepRecord(
        step=1, start_ns=1010, end_ns=1090, gpu_duration_ns=11, input_wait_ns=12, input_wait_gpu_ns=13,
        input_fetches=14, prefetch_h2d_ns=15, optimizer_steps=16, parallelism="ddp",
        peak_allocated_bytes=17, peak_reserved_bytes=18, device_total_bytes=19, exception_type="E",
        phases=(PhaseTiming(phase="backward", call=2, start_ns=1040, end_ns=1050, gpu_offset_ns=3,
                            gpu_duration_ns=4, nbytes=5),),
        collectives=(CollectiveTiming(kind="all_reduce", source="ddp", start_ns=1041, end_ns=1049, nbytes=6,
                                      blocking=True, gpu_offset_ns=7, gpu_duration_ns=8),),
        samples=20, tokens=21, loader=LoaderSettings(num_workers=1, pin_memory=True, persistent_workers=False,
                                                     prefetch_factor=2, batch_size=22, dataset="D"),
        source="inferred", between_steps_ns=23,
    )
    assert decode_step(json.loads(json.dumps(row)), anchor_ns=1000) == expected
    assert decode_step(row, anchor_ns=1000) == expected  # a StepRow itself, not a plain list


def test_calls_are_numbered_from_the_order_of_the_phase_names() -> None:
    assert calls_in_order(["forward", "backward", "forward", "backward", "optimizer"]) == (0, 0, 1, 1, 0)
    assert calls_in_order(["forward", "backward", "optimizer"]) == (0, 0, 0)
    assert calls_in_order([]) == ()


def test_decode_step_numbers_unnumbered_calls_and_keeps_given_numbers() -> None:
    def row(*phases: tuple[str, int | None]) -> list:
        values = StepRow.of(step=0, start_ns=0, end_ns=9, phases=[
            PhaseRow.timed(name, call, 1, 2, None) for name, call in phases])
        return json.loads(json.dumps(values))  # as a frame carries it

    micro = row(("forward", None), ("backward", None), ("forward", None), ("backward", None),
                ("optimizer", None))
    assert [(p.phase, p.call) for p in decode_step(micro, 0).phases] == [
        ("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1), ("optimizer", 0)]
    numbered = row(("forward", 0), ("forward", 1), ("backward", None))  # an older trainer's, and a mix
    assert [p.call for p in decode_step(numbered, 0).phases] == [0, 1, 0]
    odd = row(("forward", 7), ("forward", None))  # a given number stays, and counts as a call
    assert [p.call for p in decode_step(odd, 0).phases] == [7, 1]


def test_decode_step_numbers_a_row_straight_from_a_recorder() -> None:
    recorder = StepRecorder(_Keep(), CpuClock(), flush_steps=1000)
    recorder.begin_step()
    for name in ("forward", "forward", "h2d", "forward"):
        recorder.phase_done(name, recorder.phase_begin())
    recorder.end_step()
    recorder.flush()
    (raw,) = recorder.sink.rows
    assert [p[1] for p in raw[14]] == [None] * 4
    record = decode_step(raw, 0)
    assert [(p.phase, p.call) for p in record.phases] == [("forward", 0), ("forward", 1), ("h2d", 0),
                                                          ("forward", 2)]


class _Keep:
    def __init__(self) -> None:
        self.rows: list = []

    def send_steps(self, rows: list) -> None:
        self.rows.extend(rows)


def test_a_fetch_inside_the_step_is_its_input_wait_and_leaves_the_traced_time() -> None:
    """Gradient accumulation's second micro-batch is fetched inside the block: input wait of that step
    (added to the wait before it), and out of the block's CPU duration."""
    import time

    class Rows:
        def __init__(self) -> None:
            self.rows: list = []

        def send_steps(self, rows: list) -> None:
            self.rows.extend(rows)

    sink = Rows()
    recorder = StepRecorder(sink, CpuClock(), flush_steps=1)
    recorder.fetch_end(recorder.fetch_begin(), samples=4)
    recorder.begin_step()
    token = recorder.fetch_begin()
    time.sleep(0.005)  # a 5 ms fetch inside the step
    recorder.fetch_end(token, samples=4)
    recorder.end_step()
    (row,) = sink.rows
    record = decode_step(json.loads(json.dumps(row)), 0)
    assert record.input_fetches == 2 and record.samples == 8
    assert record.input_wait_in_step_ns is not None and record.input_wait_in_step_ns >= 5_000_000
    assert record.input_wait_ns is not None and record.input_wait_ns >= record.input_wait_in_step_ns
    assert 0 <= record.traced_cpu_ns == record.end_ns - record.start_ns - record.input_wait_in_step_ns
