"""The trainer <-> emitter control records: pinned on the wire, read by the other side as they were sent."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from tests.emit.test_emitter_faults import _hello
from traceml_otel.emit.channel import EmitterChannel
from traceml_otel.emit.pipe_session import PipeSession, read_hello
from traceml_otel.wire.control import (
    Bye,
    DeviceInfo,
    LocalReport,
    decode_bye,
    decode_device,
    decode_local_report,
    encode_bye,
    encode_device,
    encode_local_report,
)
from traceml_otel.wire.frames import FrameBuffer, WireError

WIRE_KEYS = {
    DeviceInfo: ["t", "index", "uuid"],
    Bye: ["t", "status", "dropped", "traced"],
    LocalReport: ["t", "rank", "enabled", "steps", "traced", "complete", "disabled", "refused", "dropped"],
}
"""The keys each record puts on the wire. Renaming one breaks an older trainer or emitter of the same
``WIRE_VERSION``: change it here only together with the version."""


def _frame(data: bytes) -> dict:
    buffer = FrameBuffer()
    buffer.feed(data)
    frame = buffer.next_frame()
    assert frame is not None
    return frame


def test_every_control_record_round_trips_with_its_pinned_keys() -> None:
    device = DeviceInfo(index=3, uuid="GPU-1234")
    bye = Bye(status="exception RuntimeError", dropped=7, traced=1234)
    report = LocalReport(rank=5, enabled=True, steps=1200, traced=1234, complete=False,
                         disabled={"OTLP span export": "failed"}, refused="wire version", dropped=9)
    assert list(_frame(encode_device(device))) == WIRE_KEYS[DeviceInfo]
    assert list(_frame(encode_bye(bye))) == WIRE_KEYS[Bye]
    line = encode_local_report(report)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert list(json.loads(line)) == WIRE_KEYS[LocalReport]
    assert decode_device(_frame(encode_device(device))) == device
    assert decode_bye(_frame(encode_bye(bye))) == bye
    assert decode_local_report(line) == report
    for record in (device, bye, report):  # no field left at its default: each one travelled
        defaults = type(record)(**{f.name: getattr(record, f.name) for f in fields(record)})
        assert asdict(defaults) == asdict(record)


@pytest.mark.parametrize(("frame", "message"), [
    ({"t": "bye", "traced": "12"}, "'traced' is str"),
    ({"t": "bye", "dropped": True}, "'dropped' is bool"),
    ({"t": "device"}, "lacks 'index'"),
    ({"t": "device", "index": 1.5}, "'index' is float"),
    ({"t": "steps", "s": []}, "not a bye"),
])
def test_a_malformed_control_frame_is_refused_not_misread(frame: dict, message: str) -> None:
    decode = decode_device if frame["t"] == "device" else decode_bye
    with pytest.raises(WireError, match=message):
        decode(frame)


def test_a_missing_optional_field_takes_its_default_and_junk_is_no_report() -> None:
    assert decode_bye({"t": "bye"}) == Bye()
    assert decode_device({"t": "device", "index": 0, "uuid": "x" * 300}).uuid == "x" * 128
    assert decode_local_report(b"not json") is None
    assert decode_local_report(b'{"t": "local", "rank": 0}') is None  # lacks enabled, steps
    assert decode_local_report(b'{"t": "local", "rank": 0, "enabled": 1, "steps": 0}') is None


CAPTURE = """
import os, sys
from traceml_otel.emit.pipe_session import report
from traceml_otel.wire.control import LocalReport
from traceml_otel.wire.frames import FrameBuffer
buffer, seen = FrameBuffer(), bytearray()
with open(sys.argv[1], "wb") as out:
    while data := os.read(0, 1 << 16):
        out.write(data)
        buffer.feed(data)
        while (frame := buffer.next_frame()) is not None:
            if frame["t"] == "bye":  # the trainer now waits for our report, as for a real emitter's
                out.flush()
                report(LocalReport(rank=0, enabled=True, steps=41, traced=42, complete=False,
                                   disabled={"x": "y"}))
"""


def test_what_the_trainer_sends_the_emitter_reads_and_back(tmp_path: Path) -> None:
    """The channel's real frames go through the emitter's real session; the emitter's real report
    line comes back through the channel's real reader. A field renamed on one side only fails here."""
    captured = tmp_path / "stream.bin"
    hello = _hello(tmp_path / "run")
    channel = EmitterChannel(hello, command=[sys.executable, "-c", CAPTURE, str(captured)])
    channel.send_device(2, "GPU-abc")
    channel.dropped_steps = 3  # as if the backlog had overflowed
    started = time.monotonic()
    assert channel.close(timeout_s=30, status="SIGTERM", traced=42, stall_s=30)
    assert time.monotonic() - started < 20  # the report ended the wait, not the stall timeout
    assert channel.local_report == LocalReport(rank=0, enabled=True, steps=41, traced=42, complete=False,
                                               disabled={"x": "y"})
    read, write = os.pipe()
    os.write(write, captured.read_bytes())
    os.close(write)
    buffer = FrameBuffer()
    assert read_hello(read, buffer) == hello
    session = PipeSession(read, buffer, hello)
    session.start()
    assert session.emitter is not None and session.emitter.metrics is not None
    session.run()
    os.close(read)
    stats, state = session.emitter.stats, session.emitter.metrics.state
    assert (state.cuda_device, state.gpu_uuid) == ("2", "GPU-abc")
    assert (stats.end_status, stats.capture_dropped_steps, stats.steps_traced) == ("SIGTERM", 3, 42)
    assert stats.clean_shutdown is True
