"""``traceml top --prometheus`` against a real Prometheus scraping simulated ranks and evaluating the
rendered recording rules (``benchmarks/stack_scale.py``'s simulation, at 16 ranks)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

from tests.ports import free_port
from tests.prometheus_server import start_prometheus, static_targets
from tests.tools import requires_tool
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import stack_scale  # noqa: E402

pytestmark = requires_tool("prometheus")


def test_fleet_view_from_the_recording_rules(tmp_path: Path) -> None:
    write_files(render_all(StackConfig(windows=Windows.short())), tmp_path)
    port = free_port()
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    sim = spawn.Process(target=stack_scale._serve, args=(range(16), 16, port, 0, ready), daemon=True)
    sim.start()
    assert ready.wait(120)
    server = start_prometheus(tmp_path / "server", [static_targets("traceml", [f"127.0.0.1:{port}"])],
                              rules_dir=tmp_path / "prometheus", port=free_port(avoid=(port,)))
    try:
        deadline = time.monotonic() + 120
        out = ""
        while time.monotonic() < deadline:
            command = [sys.executable, "-m", "traceml_otel.cli", "top", "--prometheus", server.url,
                       "--job", stack_scale.JOB, "--once", "-k", "3"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                                    env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
            assert result.returncode == 0, result.stderr
            out = result.stdout
            if "verdict " in out and "slowest" in out:
                break
            time.sleep(3)
        assert f"run {stack_scale.RUN_ID}" in out and "ranks 16/16 reporting" in out, out
        slowest = next(line for line in out.splitlines() if line.startswith("slowest"))
        assert len(slowest.split("  ")) == 4  # k = 3 ranks, never one row per rank
        assert "per-rank distribution" in out and "samples" in out
        assert len(out.splitlines()) < 20
    finally:
        server.stop()
        sim.kill()
