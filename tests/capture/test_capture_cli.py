"""``traceml capture`` and ``traceml top``'s ``c`` key: the request they write, and refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from traceml_otel.cli.capture import ask_capture
from traceml_otel.wire.capture_record import REQUEST_FILE, read_request


def test_ask_capture_writes_a_request_every_rank_reads(tmp_path: Path) -> None:
    request = ask_capture(tmp_path, (0, 3), 4)
    read = read_request(tmp_path / REQUEST_FILE)
    assert read == request and read.reason == "on_demand" and read.ranks == (0, 3) and read.steps == 4


def test_traceml_capture_refuses_what_is_not_a_run_folder(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "traceml_otel.cli", "capture"]
    missing = subprocess.run([*run, str(tmp_path / "nope"), "--wait", "0"], capture_output=True, text=True)
    assert missing.returncode == 2 and "is not a run folder" in missing.stderr
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    linked = subprocess.run([*run, str(tmp_path / "link"), "--wait", "0"], capture_output=True, text=True)
    assert linked.returncode == 2 and not (tmp_path / "real" / REQUEST_FILE).exists()
    escape = subprocess.run([*run, "--run-id", "../etc", "--wait", "0"], capture_output=True, text=True)
    assert escape.returncode == 2 and "not a safe name" in escape.stderr
    steps = subprocess.run([*run, str(tmp_path / "real"), "--steps", "500"], capture_output=True, text=True)
    assert steps.returncode == 2
    waited = subprocess.run([*run, str(tmp_path / "real"), "--wait", "0.5"], capture_output=True, text=True)
    assert waited.returncode == 1 and "no capture within" in waited.stderr  # nobody is running
    assert read_request(tmp_path / "real" / REQUEST_FILE).reason == "on_demand"
