"""The pipe to the emitter never blocks training and counts what it cannot deliver."""

from __future__ import annotations

import io
import sys
import time

import pytest

from tests.emit.test_emitter_faults import _hello
from traceml_otel.emit.channel import EmitterChannel
from traceml_otel.wire.frames import WireError, encode_frame, read_frames
from traceml_otel.wire.step_row import PhaseRow, StepRow, decode_step


def test_frames_round_trip_and_cut_frames_are_errors() -> None:
    phase = PhaseRow.timed("forward", 0, 11, 12, None)
    row = StepRow.of(step=3, start_ns=10, end_ns=20, input_wait_ns=5, input_fetches=1,
                   optimizer_steps=1, phases=[phase])
    stream = encode_frame({"t": "steps", "s": [row]})
    (frame,) = list(read_frames(io.BytesIO(stream)))
    record = decode_step(frame["s"][0], anchor_ns=1000)
    assert record.step == 3 and record.start_ns == 1010 and record.phases[0].start_ns == 1011
    with pytest.raises(WireError):
        list(read_frames(io.BytesIO(stream[:-3])))


def test_dead_emitter_is_counted_not_raised() -> None:
    channel = EmitterChannel(_hello(None), command=[sys.executable, "-c", "pass"])  # exits at once
    channel._process.wait(timeout=10)
    for _ in range(50):
        channel.send_steps([StepRow.of(step=0, start_ns=0, end_ns=0)] * 10)
    assert channel.broken is not None
    assert channel.dropped_steps >= 490  # the first batch may have fit in the pipe buffer
    assert channel.close(timeout_s=1.0)


def test_slow_emitter_backlog_does_not_block() -> None:
    channel = EmitterChannel(_hello(None), command=[sys.executable, "-c", "import time; time.sleep(5)"])
    phases = [PhaseRow.timed("forward", 0, 1, 2, None)] * 50
    big = [StepRow.of(step=0, start_ns=0, end_ns=0, phases=phases)] * 100
    started = time.monotonic()
    for _ in range(100):  # several MB: far more than the pipe holds, and nobody reads
        channel.send_steps(big)
    assert time.monotonic() - started < 4.0  # returned long before the reader woke up
    assert channel._backlog_bytes > 0 and channel.dropped_steps == 0
    channel._process.kill()
    channel.close(timeout_s=0.5)
    assert channel.dropped_steps > 0  # what never left is counted
