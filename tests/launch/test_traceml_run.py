"""`traceml run` and direct launches end to end: files, traces across ranks, exit codes, signals, outages."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.ports import free_port
from traceml_otel import contract as c

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", **extra)
    return env


def _only_run_dir(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def _steps_by_rank(run_dir: Path) -> dict[int, set[int]]:
    steps: dict[int, set[int]] = defaultdict(set)
    for span in read_run(run_dir):
        if span.name == c.SPAN_STEP:
            steps[span.attributes[c.ATTR_RANK]].add(span.attributes[c.ATTR_STEP])
    return steps


def test_traceml_run_quickstart_writes_local_copy_and_manifest(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(REPO / "examples" / "quickstart.py"),
         "--", "--steps", "30"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "telemetry: 30 steps" in result.stdout
    run_dir = _only_run_dir(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and manifest["world_size"] == 1
    assert manifest["end_time"] >= manifest["start_time"]
    spans = read_run(run_dir)  # strict OTLP TracesData parse of every line
    names = defaultdict(int)
    for span in spans:
        names[span.name] += 1
    assert names[c.SPAN_STEP] == 30 and names["traceml.forward"] == 30
    assert names["traceml.backward"] == 30 and names["traceml.optimizer"] == 30
    resource = spans[0].resource
    assert resource["service.name"] == "traceml-quickstart"
    assert resource["service.instance.id"] == f"{manifest['run_id']}/rank-0"
    assert {"host.name", "process.pid"} <= resource.keys()


def test_ddp_ranks_share_one_trace_per_step(tmp_path: Path) -> None:
    """Also: a decimal ``TRACEML_SHUTDOWN_TIMEOUT_S`` (2.5) is read alike by the launcher and every rank,
    and no rank loses its telemetry over it (each rank's every step is below)."""
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(REPO / "examples" / "ddp_minimal.py"),
         "--nproc-per-node", "2", "--no-report", "--", "--steps", "12"],
        env=_env(tmp_path, TRACEML_SHUTDOWN_TIMEOUT_S="2.5"), capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "telemetry disabled" not in result.stderr and "TRACEML_SHUTDOWN_TIMEOUT_S" not in result.stderr
    traces: dict[int, dict[int, str]] = defaultdict(dict)
    for span in read_run(_only_run_dir(tmp_path)):
        if span.name == c.SPAN_STEP:
            assert span.parent_span_id == ""  # a root: no orphan parent in any backend
            traces[span.attributes[c.ATTR_STEP]][span.attributes[c.ATTR_RANK]] = span.trace_id
    assert sorted(traces) == list(range(12))
    for step, by_rank in traces.items():
        assert set(by_rank) == {0, 1}
        assert by_rank[0] == by_rank[1], f"step {step} split across traces"
    assert len({by_rank[0] for by_rank in traces.values()}) == 12


def test_exit_code_is_the_scripts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(STEADY), "--no-report", "--",
         "--steps", "5", "--exit-code", "3"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 3
    manifest = json.loads((_only_run_dir(tmp_path) / "manifest.json").read_text())
    assert manifest["exit_code"] == 3
    assert _steps_by_rank(_only_run_dir(tmp_path))[0] == set(range(5))


def test_endpoint_down_training_finishes_with_one_warning(tmp_path: Path) -> None:
    port = free_port()  # a port nobody listens on
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_TIMEOUT="1",
               OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer sekret-token")
    result = subprocess.run([sys.executable, str(STEADY), "--steps", "40"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert result.stdout.count("completed") == 40
    run_dir = _only_run_dir(tmp_path)
    assert _steps_by_rank(run_dir)[0] == set(range(40))  # the local copy is complete
    warnings = [line for line in result.stderr.splitlines() if "is failing" in line]
    spans = [line for line in warnings if "OTLP span export" in line]
    metrics = [line for line in warnings if "OTLP metric export" in line]
    # At most one "is failing" per signal; an export still retrying at exit is cut short (the endpoint is
    # checked at shutdown) and its spans are then counted with the cause instead.
    assert len(spans) <= 1 and len(metrics) <= 1 and len(warnings) == len(spans) + len(metrics), result.stderr
    assert "connection refused" in result.stderr
    assert "sekret-token" not in result.stderr + result.stdout
    stats = json.loads((run_dir / c.export_stats_file_name(0)).read_text())
    assert stats["otlp_exported"] == 0 and stats["otlp_dropped"] == 160  # 40 steps x 4 spans, all counted
    assert stats["metric_exports"] == 0 and stats["metric_export_failures"] >= 1  # the final export, at least


def _run_until(
    command: list[str], env: dict[str, str], completed_at_least: int
) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True,
                               preexec_fn=_default_sigint)
    completed = -1
    deadline = time.monotonic() + 60
    while completed < completed_at_least and time.monotonic() < deadline:
        completed = max([completed, *_completed_steps(process.stdout.readline())])
    return process, completed


def _default_sigint() -> None:
    """A suite started in the background (`pytest &`) ignores SIGINT, and children inherit that;
    Python then installs no Ctrl-C handler. Tests that send SIGINT need the default back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _completed_steps(text: str) -> list[int]:
    """Every `completed N` in text; ranks sharing one pipe may still interleave their lines."""
    return [int(number) for number in re.findall(r"completed (\d+)", text)]


def _finish(process: subprocess.Popen, completed: int) -> int:
    rest, _ = process.communicate(timeout=90)
    return max([completed, *_completed_steps(rest)])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_keeps_every_completed_step(tmp_path: Path, signum: int) -> None:
    command = [sys.executable, str(STEADY), "--steps", "100000", "--sleep", "0.005"]
    process, completed = _run_until(command, _env(tmp_path), 60)
    process.send_signal(signum)
    completed = _finish(process, completed)
    assert process.returncode != 0
    steps = _steps_by_rank(_only_run_dir(tmp_path))[0]
    assert set(range(completed + 1)) <= steps
    stats = json.loads((_only_run_dir(tmp_path) / c.export_stats_file_name(0)).read_text())
    assert stats["clean_shutdown"]
    if signum == signal.SIGTERM:
        assert process.returncode == -signal.SIGTERM  # the default action still happens after our flush
        assert stats["end_status"] == "SIGTERM"
    else:
        assert stats["end_status"] == "SIGINT (Ctrl-C)"  # not "ok"


def test_a_repeated_sigterm_does_not_cut_the_flush_short(tmp_path: Path) -> None:
    """When a multi-threaded launcher is SIGKILLed, the kernel sends the parent-death signal once per
    exiting launcher thread, so a rank can get SIGTERM again while its first SIGTERM still flushes."""
    env = _env(tmp_path, TRACEML_FLUSH_STEPS="100000")  # everything is still in the trainer at the signal
    command = [sys.executable, str(STEADY), "--steps", "100000", "--sleep", "0.002"]
    process, completed = _run_until(command, env, 200)
    for _ in range(20):  # a burst of SIGTERMs, spread over the flush
        process.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    completed = _finish(process, completed)
    assert process.returncode == -signal.SIGTERM
    stats = json.loads((_only_run_dir(tmp_path) / c.export_stats_file_name(0)).read_text())
    assert stats["end_status"] == "SIGTERM", stats
    assert set(range(completed + 1)) <= _steps_by_rank(_only_run_dir(tmp_path))[0]
    manifest = json.loads((_only_run_dir(tmp_path) / "manifest.json").read_text())
    assert manifest["end_status"] == "SIGTERM", manifest  # the flush ran to its end


def test_sigkill_of_the_trainer_keeps_what_reached_the_emitter(tmp_path: Path) -> None:
    env = _env(tmp_path, TRACEML_FLUSH_STEPS="1")  # every step is handed off as it completes
    command = [sys.executable, str(STEADY), "--steps", "100000", "--sleep", "0.005"]
    process, completed = _run_until(command, env, 40)
    process.kill()
    process.communicate(timeout=30)
    run_dir = _only_run_dir(tmp_path)
    stats_path = run_dir / c.export_stats_file_name(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the orphaned emitter finishes on its own
        stats = json.loads(stats_path.read_text())
        if stats["end_status"] != "running":
            break
        time.sleep(0.1)
    assert not stats["clean_shutdown"] and "without shutdown" in stats["end_status"]
    assert set(range(completed + 1)) <= _steps_by_rank(run_dir)[0]


def test_exception_in_the_script_flushes_every_step(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(STEADY), "--steps", "50", "--raise-at", "30"],
                            env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "user bug at step 30" in result.stderr
    steps = _steps_by_rank(_only_run_dir(tmp_path))[0]
    assert steps == set(range(31))  # the failing step is kept too, marked as an error
    (failed,) = [s for s in read_run(_only_run_dir(tmp_path))
                 if s.name == c.SPAN_STEP and s.attributes[c.ATTR_STEP] == 30]
    assert failed.attributes["exception.type"] == "RuntimeError"


def test_traceml_run_passes_sigterm_to_the_ranks(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "traceml_otel.cli", "run", str(STEADY), "--no-report", "--",
               "--steps", "100000", "--sleep", "0.005"]
    process, completed = _run_until(command, _env(tmp_path), 40)
    process.send_signal(signal.SIGTERM)
    completed = _finish(process, completed)
    assert process.returncode == 128 + signal.SIGTERM
    run_dir = _only_run_dir(tmp_path)
    assert set(range(completed + 1)) <= _steps_by_rank(run_dir)[0]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == 128 + signal.SIGTERM and manifest["end_status"] == "SIGTERM"
