"""The pipe to the emitter never blocks training and counts what it cannot deliver."""

from __future__ import annotations

import io
import sys
import time

import pytest

from traceml_otel.emit.channel import EmitterChannel
from traceml_otel.emit.wire import WireError, decode_step, encode_frame, read_frames


def test_frames_round_trip_and_cut_frames_are_errors() -> None:
    phase = ["forward", 0, 11, 12, None, None, None]
    row = [3, 10, 20, None, 5, None, 1, None, 1, "none", None, None, None, None, [phase]]
    stream = encode_frame({"t": "steps", "s": [row]})
    (frame,) = list(read_frames(io.BytesIO(stream)))
    record = decode_step(frame["s"][0], anchor_ns=1000)
    assert record.step == 3 and record.start_ns == 1010 and record.phases[0].start_ns == 1011
    with pytest.raises(WireError):
        list(read_frames(io.BytesIO(stream[:-3])))


def test_dead_emitter_is_counted_not_raised() -> None:
    channel = EmitterChannel({"run_id": "r"}, command=[sys.executable, "-c", "pass"])  # exits at once
    channel._process.wait(timeout=10)
    for _ in range(50):
        channel.send_steps([[0] * 15] * 10)
    assert channel.broken is not None
    assert channel.dropped_steps >= 490  # the first batch may have fit in the pipe buffer
    assert channel.close(timeout_s=1.0)


def test_slow_emitter_backlog_does_not_block() -> None:
    channel = EmitterChannel({"run_id": "r"}, command=[sys.executable, "-c", "import time; time.sleep(5)"])
    big = [[0] * 14 + [[["forward", 0, 1, 2, None, None, None]] * 50]] * 100
    started = time.monotonic()
    for _ in range(100):  # several MB: far more than the pipe holds, and nobody reads
        channel.send_steps(big)
    assert time.monotonic() - started < 4.0  # returned long before the reader woke up
    assert channel._backlog_bytes > 0 and channel.dropped_steps == 0
    channel._process.kill()
    channel.close(timeout_s=0.5)
    assert channel.dropped_steps > 0  # what never left is counted
