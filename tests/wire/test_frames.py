"""The steps frame's fast codec (orjson) writes what the standard library wrote, and each frame is read
by the library that wrote it."""

from __future__ import annotations

import io
import json
import math

import pytest

from traceml_otel.wire import frames
from traceml_otel.wire.frames import FrameBuffer, encode_frame, encode_steps, read_frames
from traceml_otel.wire.step_row import CollectiveRow, PhaseRow, StepRow

pytest.importorskip("orjson")


def _batch() -> list[StepRow]:
    """Rows as the recorder builds them: plain phase lists, a collective, a loader, big clock readings."""
    rows = []
    for step in range(3):
        start = 22_659_953_771_395 + step * 600_000
        phases = [["forward", 0, start + 5, start + 100, None, None, None],
                  PhaseRow.timed("h2d", 0, start + 101, start + 150, 4096)]
        collective = CollectiveRow.started(kind="all_reduce", source="ddp", start_ns=start + 160,
                                           nbytes=1 << 20, blocking=False)
        rows.append(StepRow((
            step, start, start + 550_000, None, 1234, None, 1, None, 1, "ddp", 2**40, 2**41, 2**43,
            "RuntimeError" if step == 2 else None, phases, [collective], 32, None,
            [2, True, False, 2, 32, "TensorDataset"] if step == 0 else None, "trace_step",
            None if step == 0 else 12_000,
        )))
    return rows


def _stdlib(rows: list[StepRow]) -> bytes:
    return encode_frame({"t": "steps", "s": rows})


def test_steps_frame_is_byte_identical_to_the_standard_library_encoding() -> None:
    rows = _batch()
    body = json.dumps({"t": "steps", "s": rows}, separators=(",", ":")).encode()
    assert encode_steps(rows) == len(body).to_bytes(4, "big") + body
    assert _stdlib(rows) == (len(body) + 1).to_bytes(4, "big") + b" " + body  # json's: marked by a space


@pytest.mark.parametrize("odd", [10**30, "lone \ud800 surrogate"], ids=["int-beyond-64-bits", "surrogate"])
def test_what_orjson_refuses_falls_back_to_json_and_reads_back(odd: object) -> None:
    rows = _batch()
    rows[1].exception_type = odd  # a value orjson cannot write: the frame still goes out, via json
    data = encode_steps(rows)
    assert data == _stdlib(rows)
    (frame,) = read_frames(io.BytesIO(data))
    assert frame["s"][1][13] == odd  # an int, not the float orjson would read 10**30 as
    assert frame["s"][0] == json.loads(json.dumps(rows[0]))


def test_non_ascii_differs_in_bytes_but_decodes_the_same() -> None:
    rows = _batch()
    rows[0].exception_type = "Ошибка"  # orjson writes UTF-8, json escapes it: both are the same JSON
    data = encode_steps(rows)
    assert data[4:5] == b"{" and "Ошибка".encode() in data
    assert list(read_frames(io.BytesIO(data))) == list(read_frames(io.BytesIO(_stdlib(rows))))


def test_reader_takes_what_only_json_reads_and_works_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode_frame({"t": "hello", "x": math.nan, "big": 10**30})  # NaN: json's extension
    buffer = FrameBuffer()
    buffer.feed(data)
    frame = buffer.next_frame()
    assert frame is not None and math.isnan(frame["x"]) and frame["big"] == 10**30
    rows = _batch()
    fast = encode_steps(rows)
    monkeypatch.setattr(frames, "_fast_json", False)  # the orjson wheel missing on this platform
    assert encode_steps(rows) == _stdlib(rows)
    assert list(read_frames(io.BytesIO(fast))) == list(read_frames(io.BytesIO(_stdlib(rows))))
    for without in (False, None):  # not installed; not looked up yet (then it is found)
        monkeypatch.setattr(frames, "_fast_json", without)
        with pytest.raises(ValueError):
            frames.decode_body(b"{not json")
