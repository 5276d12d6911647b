"""The recorder's batching and its CUDA-event resolution logic, proven on CPU with a fake clock."""

from __future__ import annotations

from traceml_otel.capture.device_clock import CpuClock
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.wire.step_row import decode_step


class ListSink:
    def __init__(self) -> None:
        self.batches: list[list] = []

    def send_steps(self, rows: list) -> None:
        self.batches.append(rows)


class FakeEvent:
    def __init__(self, clock: FakeEventClock) -> None:
        self.time_ns = clock.device_now
        self.done = False


class FakeEventClock(CpuClock):
    """Behaves like CUDA events: marks complete only when the test says the device got there."""

    has_device = True

    def __init__(self) -> None:
        self.device_now = 0
        self.events: list[FakeEvent] = []
        self.released: list[FakeEvent] = []
        self.resets = 0

    def mark(self) -> FakeEvent:
        event = FakeEvent(self)
        self.events.append(event)
        return event

    def advance(self, ns: int) -> None:
        self.device_now += ns

    def complete_all(self) -> None:
        for event in self.events:
            event.done = True

    def reset_peak_memory(self) -> None:
        self.resets += 1

    def peak_memory(self) -> tuple[int, int, int]:
        return (100, 200, 1000)

    def is_done(self, mark: FakeEvent) -> bool:
        return mark.done

    def elapsed_ns(self, start: FakeEvent, end: FakeEvent) -> int:
        assert start.done and end.done, "elapsed_time on an unfinished event would block"
        return end.time_ns - start.time_ns

    def release(self, mark: FakeEvent) -> None:
        if mark is not None:
            self.released.append(mark)


def test_cpu_steps_flush_in_batches() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=4, flush_interval_ns=10**12)
    for _ in range(10):
        recorder.begin_step()
        recorder.end_step()
    assert [len(b) for b in sink.batches] == [4, 4]
    recorder.flush()
    assert [len(b) for b in sink.batches] == [4, 4, 2]
    steps = [decode_step(row, 0).step for batch in sink.batches for row in batch]
    assert steps == list(range(10))


def test_time_based_flush() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=10_000, flush_interval_ns=0)
    recorder.begin_step()
    recorder.end_step()
    assert len(sink.batches) == 1


def test_gpu_steps_wait_for_their_events_without_blocking() -> None:
    clock = FakeEventClock()
    sink = ListSink()
    recorder = StepRecorder(sink, clock, flush_steps=1, flush_interval_ns=10**12)
    token = recorder.fetch_begin()
    clock.advance(1_000)
    recorder.fetch_end(token)
    recorder.begin_step()
    clock.advance(500)
    phase = recorder.phase_begin()
    clock.advance(3_000)
    recorder.phase_end("forward", phase)
    clock.advance(200)
    recorder.end_step()
    assert sink.batches == []  # device not there yet: nothing resolved, nothing blocked
    assert recorder.unresolved_steps == 1
    clock.complete_all()
    recorder.flush()
    (row,) = sink.batches[0]
    record = decode_step(row, 0)
    assert record.gpu_duration_ns == 3_700
    assert record.input_wait_gpu_ns == 1_000
    (forward,) = record.phases
    assert forward.gpu_offset_ns == 500 and forward.gpu_duration_ns == 3_000
    memory = (record.peak_allocated_bytes, record.peak_reserved_bytes, record.device_total_bytes)
    assert memory == (100, 200, 1000)
    assert clock.resets == 1
    assert len(clock.released) == len(clock.events)  # every event goes back to the pool


def test_shutdown_flush_polls_for_the_last_steps() -> None:
    clock = FakeEventClock()
    sink = ListSink()
    recorder = StepRecorder(sink, clock, flush_steps=100)
    recorder.begin_step()
    recorder.end_step()
    recorder.flush(wait_s=0.01)  # never completes: gives up, keeps it unresolved
    assert recorder.unresolved_steps == 1 and sink.batches == []
    clock.complete_all()
    recorder.flush(wait_s=0.01)
    assert recorder.unresolved_steps == 0 and len(sink.batches[0]) == 1


def test_cpu_clock_reports_missing_not_zero() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1)
    recorder.begin_step()
    recorder.end_step()
    record = decode_step(sink.batches[0][0], 0)
    assert record.gpu_duration_ns is None and record.peak_allocated_bytes is None
    assert record.input_wait_ns is None and record.clock == "cpu"


def test_phase_outside_a_step_is_ignored() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1)
    token = recorder.phase_begin()
    recorder.phase_end("forward", token)
    recorder.begin_step()
    recorder.end_step()
    assert decode_step(sink.batches[0][0], 0).phases == ()


class DeviceSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.devices: list[tuple[int, str | None]] = []

    def send_device(self, index: int, uuid: str | None) -> None:
        self.devices.append((index, uuid))


class IdentifiedClock(FakeEventClock):
    def __init__(self) -> None:
        super().__init__()
        self.identity: tuple[int, str | None] | None = None

    def device_identity(self) -> tuple[int, str | None] | None:
        return self.identity


def test_device_identity_is_reported_once_known_and_on_change() -> None:
    sink, clock = DeviceSink(), IdentifiedClock()
    recorder = StepRecorder(sink, clock, flush_steps=1, flush_interval_ns=10**12)

    def one_step() -> None:
        recorder.begin_step()
        recorder.end_step()
        clock.complete_all()
        recorder.flush()

    one_step()
    assert sink.devices == []  # CUDA not initialised by the program yet: nothing to say
    clock.identity = (1, "GPU-abc")
    one_step()
    one_step()
    assert sink.devices == [(1, "GPU-abc")]  # once, not per flush
    clock.identity = (2, "GPU-def")
    one_step()
    assert sink.devices == [(1, "GPU-abc"), (2, "GPU-def")]
    plain = StepRecorder(ListSink(), IdentifiedClock(), flush_steps=1)  # a sink without send_device
    plain.begin_step()
    plain.end_step()
    plain.flush()


def test_gpu_uuid_label_matches_dcgm() -> None:
    from traceml_otel.capture.device_clock import gpu_uuid_label

    uuid = "5f1b2c3d-0000-1111-2222-333344445555"
    assert gpu_uuid_label(uuid) == f"GPU-{uuid}"
    assert gpu_uuid_label("GPU-5f1b") == "GPU-5f1b"
    assert gpu_uuid_label("MIG-5f1b") == "MIG-5f1b"
    assert gpu_uuid_label(None) is None and gpu_uuid_label("") is None
    assert CpuClock().device_identity() is None


def test_cuda_clock_device_identity_reads_torch_once_per_device() -> None:
    from types import SimpleNamespace

    from traceml_otel.capture.device_clock import CudaEventClock

    calls: list[int] = []

    def properties(device: int) -> SimpleNamespace:
        calls.append(device)
        return SimpleNamespace(uuid=f"uuid-{device}", total_memory=1)

    clock = object.__new__(CudaEventClock)  # no CUDA here: the seam's logic with a fake torch
    clock._torch = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=properties))
    clock._uuids = {}
    clock._device = None
    assert clock.device_identity() is None  # the program has not initialised CUDA yet
    clock._device = 3
    assert clock.device_identity() == (3, "GPU-uuid-3")
    assert clock.device_identity() == (3, "GPU-uuid-3")
    assert calls == [3]


def test_gpu_collectives_resolve_from_their_events_and_wait_for_the_last_one() -> None:
    clock = FakeEventClock()
    sink = ListSink()
    recorder = StepRecorder(sink, clock, flush_steps=1, flush_interval_ns=10**12)
    recorder.begin_step()
    clock.advance(1_000)
    token = recorder.collective_begin("all_reduce", "ddp", 4096, False)
    clock.advance(2_000)
    recorder.end_step()  # the step's own events are done before the collective's completion event
    for event in clock.events:
        event.done = True
    clock.advance(5_000)
    recorder.collective_end(token)  # marked later, on the communication side
    end_event = clock.events[-1]
    recorder.flush()
    assert sink.batches == [], "a step waits for its collectives' completion events"
    end_event.done = True
    recorder.flush()
    record = decode_step(sink.batches[0][0], 0)
    (collective,) = record.collectives
    assert (collective.kind, collective.source, collective.nbytes) == ("all_reduce", "ddp", 4096)
    assert collective.gpu_offset_ns == 1_000 and collective.gpu_duration_ns == 7_000
    assert len(clock.released) == len(clock.events)


def test_collectives_outside_a_step_and_old_rows() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1)
    assert recorder.collective_begin("barrier", "api", 0, True) is None
    recorder.begin_step()
    recorder.end_step()
    row = sink.batches[0][0]
    assert decode_step(row, 0).collectives == ()
    assert decode_step(row[:15], 0).collectives == ()  # a row from before collectives were captured
