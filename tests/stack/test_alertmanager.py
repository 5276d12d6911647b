"""The example Alertmanager configuration: valid for amtool, routes by severity and namespace,
inhibits a failed or hung run's performance alerts, and routes the dead-man's switch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.tools import requires_tool

CONFIG = Path(__file__).resolve().parents[2] / "alertmanager" / "alertmanager.yml"
AMTOOL = shutil.which("amtool")
needs_amtool = requires_tool(
    "amtool", install="apt-get install prometheus-alertmanager; or bash scripts/setup.sh --test"
)


def route(*labels: str) -> str:
    assert AMTOOL is not None
    result = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={CONFIG}", *labels],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_amtool
def test_amtool_accepts_it() -> None:
    result = subprocess.run([AMTOOL, "check-config", str(CONFIG)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@needs_amtool
def test_routes_by_severity_and_namespace() -> None:
    assert route("alertname=TraceMLJobFailed", "severity=critical", "namespace=team-a") == "team-a-pager"
    assert route("alertname=TraceMLJobFailed", "severity=critical", "namespace=team-b") == "ml-platform-pager"
    assert route("alertname=TraceMLInputBound", "severity=warning", "namespace=team-a") == "team-a-chat"
    assert route("alertname=TraceMLJobInterrupted", "severity=warning") == "traceml-tickets"
    assert route("alertname=TraceMLHeartbeat", "severity=info") == "traceml-heartbeat"


def test_failures_inhibit_the_runs_performance_alerts() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    (rule,) = [r for r in config["inhibit_rules"] if "TraceMLJobFailed" in r["source_matchers"][0]]
    assert "TraceMLTrainingStalled" in rule["source_matchers"][0]
    assert rule["target_matchers"] == ['severity="warning"']
    assert {"traceml_run_id", "namespace", "cluster"} <= set(rule["equal"])


def test_render_says_when_the_links_are_placeholders(tmp_path: Path) -> None:
    import sys

    base = [sys.executable, "-m", "traceml_otel.cli", "stack", "render", "-o"]
    env = {"PYTHONPATH": str(CONFIG.parents[1])}
    plain = subprocess.run([*base, str(tmp_path / "a")], capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 0 and "placeholder" in plain.stderr and "--runbook-url" in plain.stderr
    linked = subprocess.run([*base, str(tmp_path / "b"), "--runbook-url", "https://rb.example.com/traceml",
                             "--dashboard-url", "https://g.example.com/d/t"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert linked.returncode == 0 and "placeholder" not in linked.stderr, linked.stderr
