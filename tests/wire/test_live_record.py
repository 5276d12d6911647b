"""rank-R.live.json: round trip, bounds, and refusal of what is not a live record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceml_otel.wire._json import RecordError
from traceml_otel.wire.live_record import (
    MAX_LIST,
    LiveHang,
    LiveRecord,
    OutsideKind,
    live_file_name,
    read_live_record,
    write_live_record,
)


def test_round_trip(tmp_path: Path) -> None:
    record = LiveRecord(run_id="r", rank=3, seq=7, written_at=1.5e9, steps=120, last_step=119,
                        step_median_s=0.1, window={"forward": 0.02, "residual": None},
                        outside=(OutsideKind("eval", 3.0, 2),), degraded=("local copy: full disk",),
                        hang=LiveHang("hung", 12.0, "backward", "train.py:40", "loss.backward()"))
    write_live_record(tmp_path, record)
    assert (tmp_path / live_file_name(3)).is_file()
    assert read_live_record(tmp_path / live_file_name(3)) == record


def test_bounded(tmp_path: Path) -> None:
    record = LiveRecord(run_id="r", rank=0, seq=1, written_at=1.0,
                        outside=tuple(OutsideKind(f"k{i}", 1.0, 1) for i in range(100)),
                        degraded=tuple("x" * 10_000 for _ in range(100)))
    write_live_record(tmp_path, record)
    path = tmp_path / live_file_name(0)
    assert path.stat().st_size < 8 << 10
    back = read_live_record(path)
    assert len(back.outside) == MAX_LIST and len(back.degraded) == MAX_LIST


@pytest.mark.parametrize("data", [{"version": 2, "rank": 0, "seq": 1, "written_at": 1.0},
                                  {"version": 1, "rank": -1, "seq": 1, "written_at": 1.0},
                                  {"version": 1, "rank": 0, "written_at": 1.0}])
def test_refused(tmp_path: Path, data: dict[str, object]) -> None:
    path = tmp_path / "rank-0.live.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError):
        read_live_record(path)


def test_link_not_followed(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / live_file_name(0)).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(RecordError):
        read_live_record(tmp_path / live_file_name(0))
    with pytest.raises(OSError):
        write_live_record(tmp_path, LiveRecord(run_id="r", rank=0, seq=1, written_at=1.0))
