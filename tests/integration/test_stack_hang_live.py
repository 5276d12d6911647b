"""A hang before the first step pages, with the rank, on a real Prometheus: a real 2-rank gloo job
under ``traceml run`` whose rank 1 sleeps before its loop while rank 0 waits for it in a barrier
(short timeouts: the watchdog's before-first-step timeout 3 s, the short rule profile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ports import free_port, free_port_pair
from tests.prometheus_server import start_prometheus, static_targets
from tests.tools import requires_tool
from tests.waiting import wait_for
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "stuck_before_first_step.py"
pytestmark = requires_tool("prometheus")


def test_a_hang_before_the_first_step_pages_with_the_rank(tmp_path: Path) -> None:
    write_files(render_all(StackConfig(windows=Windows.short())), tmp_path)
    port = free_port_pair()
    prometheus = start_prometheus(tmp_path / "prom", [static_targets("traceml", [f"127.0.0.1:{port}",
                                                                                f"127.0.0.1:{port + 1}"])],
                                  rules_dir=tmp_path / "prometheus", port=free_port(avoid=(port, port + 1)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO),
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_HANG_STARTUP_TIMEOUT_S="3",
               TRACEML_FLUSH_INTERVAL_MS="100", STUCK_S="240")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "stuck", "--nproc-per-node", "2",
         str(SCRIPT)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        prometheus.wait_ready()

        def page() -> list[dict]:
            return [a for a in prometheus.api("alerts")["alerts"]
                    if a["labels"].get("alertname") == "TraceMLTrainingStalled" and a["state"] == "firing"]

        wait_for(lambda: bool(page()), 150, "no hang page before the first step", prometheus.log)
        (alert,) = page()
        assert alert["labels"]["traceml_run_id"] == "stuck" and alert["labels"]["severity"] == "critical"
        assert alert["labels"]["traceml_rank"] == "1", alert
        assert "before first step" in alert["annotations"]["description"], alert
        phases = {r["metric"]["traceml_rank"]: r["metric"]["traceml_phase_name"] for r in prometheus.query(
            'traceml_progress_stalled_seconds{traceml_run_id="stuck"} > 0')}
        assert phases.get("1") == "before first step", phases
    finally:
        launcher.kill()
        launcher.communicate(timeout=60)
        prometheus.stop()
