"""Deep captures across ranks and on demand: a 2-rank gloo job whose rank 1 turns straggler half-way,
and ``traceml capture`` against a running job (real ``traceml run`` processes)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port
from traceml_otel.wire.capture_record import REQUEST_FILE, read_summaries

REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "tests" / "capture" / "scripts" / "capture_loops.py"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", **extra)
    return env


def _launch(*args: str) -> list[str]:
    return [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", *args]


def test_rank_that_turns_straggler_is_captured_and_its_peer_is_not(tmp_path: Path) -> None:
    result = subprocess.run(
        _launch("--nproc-per-node", "2", str(LOOPS), "--", "--loop", "straggler", "--steps", "240",
                "--sleep", "0.003", "--width", "768"),
        # Default settings but the spike trigger's factor: on the loaded CI machine the other tests' bursts
        # made real, recurring spikes (rank 0 once: 4.5 x its p95; rank 1 once: 5.1 x at step 116, four
        # steps before it turns straggler), and a spike capture takes the rank's one capture of the
        # interval, so the straggler's was refused. The spike trigger has its own tests.
        env=_env(tmp_path, TRACEML_CAPTURE_SPIKE_K="1000"), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summaries, problems = read_summaries(run_dir)
    assert not problems
    seen = [(s.rank, s.reason, s.detail) for s in summaries]
    # The straggler capture is rank 1's alone (a spike capture would be a rank's own, never the straggler's).
    assert {s.rank for s in summaries if s.reason != "spike"} == {1}, seen
    (capture,) = [s for s in summaries if s.rank == 1 and s.reason == "straggler"]
    assert "this rank's own work rose" in capture.detail
    assert min(capture.steps) >= 120  # after rank 1 slowed down, half-way
    assert capture.top_cpu[0].name == "aten::mm"  # the extra work
    assert any("allreduce" in op.name for op in capture.collectives), capture.collectives
    assert all(s.reason == "spike" for s in summaries if s.rank == 0), seen  # never as the straggler


def test_traceml_capture_against_a_running_job(tmp_path: Path) -> None:
    env = _env(tmp_path)
    job = subprocess.Popen(_launch(str(LOOPS), "--", "--loop", "slow", "--steps", "150", "--sleep", "0.15"),
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline:  # wait for the job's first steps
            runs = list((tmp_path / "runs").glob("*/rank-0.steps.csv"))
            if runs and runs[0].stat().st_size > 2000:
                run_dir = runs[0].parent
                break
            time.sleep(0.2)
        assert run_dir is not None, "the job wrote no steps"
        asked = time.time()
        done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "capture", str(run_dir),
                               "--steps", "2", "--wait", "90"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "rank 0: rank-0.capture-1 steps" in done.stdout
        took = time.time() - asked
        _, stderr = job.communicate(timeout=180)
        assert job.returncode == 0, stderr[-2000:]
    finally:
        if job.poll() is None:
            job.kill()
    request = json.loads((run_dir / REQUEST_FILE).read_text())
    (capture,) = [s for s in read_summaries(run_dir)[0] if s.request_id == request["id"]]
    assert capture.reason == "on_demand" and len(capture.steps) == 2 and capture.trace_file
    # A person's capture is never refused for its cost (here: early, over the automatic budget); it says it.
    assert capture.cost_s > 0 and capture.train_s > 0
    assert f"(cost the training thread at most {capture.cost_s:.2f} s, " in done.stdout, done.stdout
    assert "cost the training thread at most" in stderr
    # Soon after the request: the poller looks every 0.2 s and arms the next step (steps here take
    # ~0.15 s), so the first captured step opens well within a second of the request, loaded machine
    # or not (a CI run saw 3 steps, 0.45 s; the bound is not tight on purpose).
    starts = {int(r["step"]): int(r["start_unix_nano"]) / 1e9 for r in csv.DictReader(
        (run_dir / "rank-0.steps.csv").open())}
    before = max(step for step, start in starts.items() if start <= request["requested_unix"])
    assert capture.steps[0] > before, (before, capture.steps)  # never a step that began before it
    assert starts[capture.steps[0]] - request["requested_unix"] < 1.5, (before, capture.steps)
    assert took < 30, took  # request to summary on disk, export included, on a loaded machine


def test_post_capture_on_the_metrics_port_captures_that_rank(tmp_path: Path) -> None:
    """An Alertmanager webhook (any POST) on the rank's scrape endpoint asks it for a capture."""
    port = free_port()
    env = _env(tmp_path, TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="0")
    job = subprocess.Popen(_launch(str(LOOPS), "--", "--loop", "slow", "--steps", "120", "--sleep", "0.1"),
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        reply = None
        while time.monotonic() < deadline and reply is None:
            try:
                post = urllib.request.Request(f"http://127.0.0.1:{port}/capture?steps=2", method="POST",
                                              data=json.dumps({"alerts": [{"status": "firing"}]}).encode())
                with urllib.request.urlopen(post, timeout=5) as answer:
                    reply = (answer.status, json.loads(answer.read()))
            except OSError:
                time.sleep(0.3)
        assert reply is not None and reply[0] == 202 and reply[1]["rank"] == 0, reply
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert b"traceml" in answer.read()  # the scrape itself is unchanged
        _, stderr = job.communicate(timeout=180)
        assert job.returncode == 0, stderr[-2000:]
    finally:
        if job.poll() is None:
            job.kill()
    (run_dir,) = (tmp_path / "runs").iterdir()
    (capture,) = [s for s in read_summaries(run_dir)[0] if s.request_id == reply[1]["request"]]
    assert capture.reason == "on_demand" and len(capture.steps) == 2 and capture.trace_file
