"""Reading files we did not write: only regular files, never blocking, each line bounded (issue 21)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from traceml_otel.wire._json import RecordError, read_json_object
from traceml_otel.wire.bounded_file import RefusedFile, bounded_lines, open_regular, read_bounded


def _lines(path: Path, **kwargs: int) -> list[tuple[int, bytes | None, str | None]]:
    fd = open_regular(path)
    try:
        return [(line.number, line.data, line.skipped) for line in bounded_lines(fd, **kwargs)]
    finally:
        os.close(fd)


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.traces.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    sock_path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    done = threading.Event()

    def attempt() -> None:  # a FIFO with no writer would block a plain open() forever
        for path, kind in ((fifo, "a FIFO"), (zero, "a character device"), (sock_path, "a socket"),
                           (tmp_path, "a directory")):
            with pytest.raises(RefusedFile, match=f"is {kind}"):
                open_regular(path)
        done.set()

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(20)
    server.close()
    assert done.is_set(), "open_regular blocked on a special file"
    with pytest.raises(RefusedFile, match="symbolic link; not followed"):
        open_regular(zero, follow_links=False)


def test_records_behind_a_fifo_or_a_device_are_a_record_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "manifest.json")
    (tmp_path / "rank-0.export.json").symlink_to("/dev/zero")
    with pytest.raises(RecordError, match="FIFO"):
        read_json_object(tmp_path / "manifest.json")
    with pytest.raises(RecordError, match="symbolic link"):
        read_json_object(tmp_path / "rank-0.export.json")


def test_lines_are_bounded_and_nul_runs_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a":1}\n\n   \n' + b"\0" * 5000 + b"\n" + b"x" * 300 + b'\n{"b":2}')
    assert _lines(path, max_line=100, chunk=64) == [
        (1, b'{"a":1}', None),
        (4, None, "5,000 NUL bytes skipped (a crash-time tail?)"),
        (5, None, "a line of 300 bytes, longer than 100, skipped"),
        (6, b'{"b":2}', None),
    ]


def test_a_10_gb_sparse_file_is_skipped_by_its_holes_not_read(tmp_path: Path) -> None:
    path = tmp_path / "sparse.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"x":1}\n')
        handle.truncate(10 << 30)
    lines = _lines(path)
    assert lines[0] == (1, b'{"x":1}', None)
    skipped = sum(int(text.split()[0].replace(",", "")) for _, data, text in lines if text)
    assert skipped == (10 << 30) - 8  # every NUL byte accounted for, none returned as data
    assert all(data is None for _, data, _ in lines[1:])


def test_read_bounded_refuses_a_file_over_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2000)
    assert read_bounded(path, 2000) == b" " * 2000
    with pytest.raises(RefusedFile, match="larger than"):
        read_bounded(path, 1999)
