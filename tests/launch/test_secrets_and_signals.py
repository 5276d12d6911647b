"""Secrets stay out of output and files; hostile span data stays out of the terminal; the
rendezvous stays on 127.0.0.1; ranks stop when the launcher is killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.otlp_receiver import OtlpHttpReceiver
from tests.launch.test_traceml_run import STEADY, _env, _only_run_dir, _run_until
from traceml_otel import contract as c
from traceml_otel.sanitize import redact_argv, strip_control

MARKER = "Zq7SECRETmarker"


def _everything_written(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file())


def test_malformed_otlp_header_value_appears_nowhere(tmp_path: Path) -> None:
    with OtlpHttpReceiver() as receiver:
        env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                   OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                   OTEL_EXPORTER_OTLP_HEADERS=f"authorization:Bearer {MARKER}")  # ':' instead of '='
        result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", str(STEADY),
                                 "--html-report", "--", "--steps", "10"],
                                env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "Header format invalid" in result.stderr and "[redacted]" in result.stderr  # the SDK did speak
    assert MARKER not in result.stdout + result.stderr
    assert MARKER.encode() not in _everything_written(tmp_path / "runs")


def test_secret_script_arguments_are_redacted_in_manifest_and_reports(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(STEADY), "--html-report", "--",
         "--steps", "6", "--api-token", MARKER, f"HF_TOKEN={MARKER}", f"--db-password={MARKER}"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr
    run_dir = _only_run_dir(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["command"][-5:] == ["6", "--api-token", "[redacted]", "HF_TOKEN=[redacted]",
                                        "--db-password=[redacted]"]
    assert {"report.json", "report.html"} <= {p.name for p in run_dir.iterdir()}
    assert MARKER.encode() not in _everything_written(run_dir)
    assert MARKER not in result.stdout


def test_redaction_keeps_ordinary_arguments() -> None:
    argv = ["train.py", "--lr", "0.1", "--keyword", "cat", "--key", "k1", "https://u:pw@host/x", "--auth"]
    assert redact_argv(argv) == ["train.py", "--lr", "0.1", "--keyword", "cat", "--key", "[redacted]",
                                 "https://u:[redacted]@host/x", "--auth"]


def test_control_characters_from_span_data_never_reach_the_terminal(tmp_path: Path) -> None:
    from tests.emit.test_emitter_faults import _hello, _rows
    from traceml_otel.emit.worker import Emitter

    run_dir = tmp_path / "run"
    hostile = "run\x1b[2J\x1b]0;owned\x07\x1b[31mRED\r"
    emitter = Emitter(_hello(run_dir, run_id=hostile, host="h\x1b[5m"))
    emitter.handle_steps(_rows(0, 20))
    emitter.finish("ok", 0, True, steps_traced=20)
    result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert "RED" in result.stdout  # the run id is shown, defanged
    for control in ("\x1b", "\x07", "\r"):
        assert control not in result.stdout and control not in result.stderr
    assert strip_control("a\x1b[31mb\tc\nd\x9b") == "ab\tc\nd"


def _listening_addresses(pid: int) -> list[str]:
    """Local addresses of the TCP sockets ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(f"{table}:{fields[1]}")
    return found


def test_single_node_rendezvous_listens_on_loopback_only_and_ranks_die_with_the_launcher(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "traceml_otel.cli", "run", str(STEADY), "--nproc-per-node", "2",
               "--no-report", "--", "--steps", "100000", "--sleep", "0.01"]
    launcher, completed = _run_until(command, _env(tmp_path), 10)
    try:
        addresses = _listening_addresses(launcher.pid)
        assert addresses, "the launcher hosts the rendezvous store"
        loopback = "0100007F:"  # 127.0.0.1 in /proc/net/tcp
        assert all(a.startswith("tcp:" + loopback) for a in addresses), addresses
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text()
        ranks = [int(pid) for pid in children.split()]
        assert len(ranks) == 2
        launcher.kill()  # SIGKILL: no chance to forward anything
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        alive = ranks
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in ranks if _alive(pid)]
        assert not alive, f"ranks {alive} kept running after the launcher was killed"
    finally:
        if launcher.poll() is None:
            launcher.kill()
    stats_path = _only_run_dir(tmp_path) / c.export_stats_file_name(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and json.loads(stats_path.read_text())["end_status"] == "running":
        time.sleep(0.2)
    stats = json.loads(stats_path.read_text())
    assert stats["end_status"] == "SIGTERM", stats  # flushed on the way out
    assert completed >= 10


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
