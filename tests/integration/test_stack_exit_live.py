"""How a job ends, paged on a real Prometheus with the short-profile rules: a real 2-rank job whose
ranks call ``sys.exit(1)`` pages TraceMLJobFailed once (critical); a real 2-rank job cancelled with
SIGTERM gives the warning TraceMLJobInterrupted and no critical alert at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.ports import free_port, free_port_pair
from tests.prometheus_server import start_prometheus, static_targets
from tests.tools import requires_tool
from tests.waiting import wait_for
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"
pytestmark = requires_tool("prometheus")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _launch(tmp: Path, run_id: str, port: int, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp / "runs"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="5",
               TRACEML_FLUSH_INTERVAL_MS="100")
    return subprocess.Popen([sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", run_id,
                             "--nproc-per-node", "2", str(STEADY), "--", *args],
                            env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ignore_sigint)


def test_sys_exit_pages_once_and_a_cancel_never_pages_critical(tmp_path: Path) -> None:
    write_files(render_all(StackConfig(windows=Windows.short())), tmp_path)
    exits, cancel = free_port_pair(), free_port_pair()
    targets = [f"127.0.0.1:{p}" for p in (exits, exits + 1, cancel, cancel + 1)]
    prometheus = start_prometheus(tmp_path / "prom", [static_targets("traceml", targets)],
                                  rules_dir=tmp_path / "prometheus",
                                  port=free_port(avoid=(exits, exits + 1, cancel, cancel + 1)))
    failing = _launch(tmp_path, "exits", exits, "--steps", "60", "--sleep", "0.05", "--exit-code", "1")
    cancelled = _launch(tmp_path, "cancel", cancel, "--steps", "100000", "--sleep", "0.02")
    try:
        prometheus.wait_ready()
        assert cancelled.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "completed 40" not in cancelled.stdout.readline():
            pass
        wait_for(lambda: bool(prometheus.query('traceml_run_ended{traceml_run_id="cancel"} == 0')), 30,
                 "the cancelled run was never scraped", prometheus.log)
        cancelled.send_signal(signal.SIGTERM)
        cancelled.communicate(timeout=120)
        out, _ = failing.communicate(timeout=180)
        assert failing.returncode != 0, out
        ended = time.time()

        def alerts(run_id: str) -> list[dict]:
            return [a for a in prometheus.api("alerts")["alerts"]
                    if a["labels"].get("traceml_run_id") == run_id and a["state"] == "firing"]

        wait_for(lambda: any(a["labels"]["alertname"] == "TraceMLJobFailed" for a in alerts("exits")), 60,
                 "sys.exit(1) did not page", prometheus.log)
        wait_for(lambda: any(a["labels"]["alertname"] == "TraceMLJobInterrupted" for a in alerts("cancel")),
                 60, "the cancel gave no notice", prometheus.log)
        time.sleep(8)  # past the missing-rank and stall windows of the short profile
        (page,) = [a for a in alerts("exits") if a["labels"]["severity"] == "critical"]
        assert page["labels"]["alertname"] == "TraceMLJobFailed" and page["value"].startswith("2"), page
        assert "SystemExit (exception) on 2 rank(s)" in page["annotations"]["description"], page
        firing = 'ALERTS{traceml_run_id="cancel", severity="critical", alertstate="firing"}'
        critical = prometheus.series_times(firing, ended - 120, time.time())  # a page, not a pending one
        assert not critical, prometheus.query(
            'max_over_time(ALERTS{traceml_run_id="cancel", severity="critical"}[5m])')
        (notice,) = alerts("cancel")
        assert notice["labels"]["severity"] == "warning"
    finally:
        for proc in (failing, cancelled):
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
        prometheus.stop()
