"""Faults never stop or fail training: a read-only or full runs folder, a busy Prometheus port,
an endpoint that swallows requests, busy CPUs. Each loses only its own output, says so, and is
counted; ``traceml run`` returns the script's exit code and its account matches the emitters'."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.faulty_disk import read_only_dir, tiny_disk
from tests.integration.otlp_receiver import OtlpHttpReceiver
from tests.launch.test_traceml_run import REPO, STEADY, _env, _steps_by_rank
from tests.ports import free_port_pair
from traceml_otel import contract as c


def _traceml_run(env: dict[str, str], *arguments: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", *arguments], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _otlp_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    return _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_METRICS_EXPORTER="none", **extra)


def _step_spans(receiver: OtlpHttpReceiver) -> set[int]:
    return {s.attributes[c.ATTR_STEP] for s in receiver.spans() if s.name == c.SPAN_STEP}


def test_read_only_runs_folder_keeps_training_and_otlp(tmp_path: Path) -> None:
    with OtlpHttpReceiver() as receiver, read_only_dir(tmp_path / "runs"):
        result = _traceml_run(_otlp_env(tmp_path, receiver.endpoint), str(STEADY), "--", "--steps", "20",
                              "--exit-code", "3")
        assert result.returncode == 3, result.stderr  # the script's own exit code
        assert result.stdout.count("completed") == 20
        assert "Traceback" not in result.stderr, result.stderr
        assert "traceml: cannot write" in result.stderr and "manifest.json" in result.stderr
        assert re.search(r"^traceml: rank 0: local copy turned off: ", result.stderr, re.M), result.stderr
        assert "the local copy was turned off" in result.stderr  # the trainer's own count
        assert _step_spans(receiver) == set(range(20))  # OTLP export unaffected
        assert "is not writable (read-only runs folder?)" in result.stdout, result.stdout  # not "init()?"
        assert "did the script call traceml.init()" not in result.stdout


def test_full_disk_keeps_training_and_otlp_and_says_what_the_local_copy_holds(tmp_path: Path) -> None:
    with OtlpHttpReceiver() as receiver, tiny_disk(tmp_path / "runs", size="64k") as runs:
        result = _traceml_run(_otlp_env(tmp_path, receiver.endpoint), str(STEADY), "--no-report", "--",
                              "--steps", "400")
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("completed") == 400
        assert "Traceback" not in result.stderr, result.stderr
        assert re.search(r"^traceml: rank 0: local copy turned off: .*No space left", result.stderr, re.M)
        assert _step_spans(receiver) == set(range(400))
        (run_dir,) = runs.iterdir()
        stats = json.loads((run_dir / c.export_stats_file_name(0)).read_text())
        written = len(_steps_by_rank(run_dir)[0])
        assert stats["final"] and stats["local_copy_complete"] is False
        assert stats["steps_traced"] == 400 and stats["steps_local"] == written < 400
        assert f"local copy holds {written} of 400 traced steps (INCOMPLETE)" in result.stdout
        assert "local copy turned off" in result.stdout  # the launcher's account names the fault


def test_busy_prometheus_port_on_one_rank_of_two(tmp_path: Path) -> None:
    """Rank 1's port is held: only its endpoint goes; the account and `traceml analyze` name it."""
    port = free_port_pair()  # rank 0 may use P; rank 1's P+1 is held
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        env = _env(tmp_path, TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="0")
        result = _traceml_run(env, str(REPO / "examples" / "ddp_minimal.py"), "--nproc-per-node", "2",
                              "--no-report", "--", "--steps", "8")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^traceml: rank 1: Prometheus endpoint turned off: cannot serve on "
                     rf"127\.0\.0\.1:{port + 1}", result.stderr, re.M), result.stderr
    assert "rank 0: Prometheus" not in result.stderr
    assert f"rank 1: Prometheus endpoint turned off: cannot serve on 127.0.0.1:{port + 1}" in result.stdout
    assert "local copy: 16 of 16 traced steps written (complete)" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert _steps_by_rank(run_dir) == {0: set(range(8)), 1: set(range(8))}
    rank0 = json.loads((run_dir / c.export_stats_file_name(0)).read_text())
    rank1 = json.loads((run_dir / c.export_stats_file_name(1)).read_text())
    assert rank0["outputs_disabled"] == {} and "Prometheus endpoint" in rank1["outputs_disabled"]
    analyzed = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir)],
                              capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    text = " ".join(analyzed.stdout.split())  # wrapped lines joined
    assert "TELEMETRY DEGRADED [warning] - rank 1: telemetry outputs" in text, text
    assert f"rank 1: Prometheus endpoint turned off (cannot serve on 127.0.0.1:{port + 1}" in text, text


def _blackhole() -> tuple[socket.socket, str]:
    """A server that accepts connections and reads requests but never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            held.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    return server, f"http://127.0.0.1:{server.getsockname()[1]}"


def test_blackhole_endpoint_account_matches_what_the_emitter_reports(tmp_path: Path) -> None:
    server, endpoint = _blackhole()
    try:
        env = _otlp_env(tmp_path, endpoint, TRACEML_SHUTDOWN_TIMEOUT_S="2", OTEL_EXPORTER_OTLP_TIMEOUT="30")
        result = _traceml_run(env, str(STEADY), "--no-report", "--", "--steps", "30")
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    stats = json.loads((run_dir / c.export_stats_file_name(0)).read_text())
    assert stats["final"]
    assert stats["otlp_exported"] == 0 and stats["otlp_dropped"] == 30 * 4  # every span counted
    match = re.search(r"OTLP to \S+: (\d+) spans delivered, (\d+) not delivered", result.stdout)
    assert match, result.stdout
    assert (int(match[1]), int(match[2])) == (stats["otlp_exported"], stats["otlp_dropped"])
    assert "local copy: 30 of 30 traced steps written (complete)" in result.stdout


def _load_benchmark():
    path = REPO / "benchmarks" / "local_copy_under_load.py"
    spec = importlib.util.spec_from_file_location("local_copy_under_load", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_local_copy_complete_under_cpu_load_with_a_dead_endpoint() -> None:
    """Two CPU-bound neighbours, a dead endpoint and a 1 s shutdown deadline (the old code dropped
    what the emitter had not taken within it): every step must still be in the local copy."""
    out = _load_benchmark().run(steps=2000, neighbours=2, step_ms=0.5,
                                extra_env={"TRACEML_SHUTDOWN_TIMEOUT_S": "1"})
    assert out["returncode"] == 0, out["stderr"]
    assert out["steps_in_local_copy"] == 2000
    stats = out["stats"]
    assert stats["local_copy_complete"] is True and stats["steps_local"] == stats["steps_traced"] == 2000
    assert out["exit_s"] < 120  # generous: a loaded 2-core CI machine


def test_diagnosis_is_printed_when_its_report_file_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    """Simulated ENOSPC (a seam: Path.write_text raises) for report.json: the text still comes."""
    import errno

    from tests.emit.test_emitter_faults import _hello, _rows
    from traceml_otel.cli.analyze import diagnose_run_directory
    from traceml_otel.emit.worker import Emitter

    run_dir = tmp_path / "run"
    emitter = Emitter(_hello(run_dir))
    emitter.handle_steps(_rows(0, 30))
    emitter.finish("ok", 0, True, steps_traced=30)

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("traceml_otel.cli.analyze.write_atomically", full)  # how report files are written
    text = diagnose_run_directory(run_dir, html=True)
    assert "traceml-otel diagnosis" in text
    assert "Report: not written to" in text and "No space left" in text
