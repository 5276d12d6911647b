"""Pages on a real Prometheus (2.42, the short-profile rules: seconds instead of minutes) with real
processes, the cases promtool alone showed before (prometheus/tests/paging_test.yml has the long ones):

- 'oom': a 2-rank gloo job under ``traceml run`` whose rank 1 is SIGKILLed mid-run: TraceMLJobFailed
  names rank 1 (SIGKILL) from the launcher's view of its children; no other critical page for the run;
- 'eval': a marked evaluation (``outside_step``) longer than the stall window (10 s in the short
  profile; 5 min in the shipped one) with a 3 s hang timeout: no alert at all;
- 'a-1', 'b-1', 'a-2': one job name ('train') in namespaces team-a and team-b (target labels). a-1
  fails; b-1, a later attempt in the other namespace, does not silence it; a-2, the restart in
  team-a, does, and a-2's clean end does not bring a-1's page back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port, free_port_pair
from tests.prometheus_server import Prometheus, start_prometheus
from tests.tools import requires_tool
from tests.waiting import wait_for
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
KILLED = REPO / "tests" / "launch" / "scripts" / "killed_rank.py"
pytestmark = requires_tool("prometheus")


def _env(tmp: Path, port: int, **extra: str) -> dict[str, str]:
    cleared = ("OTEL_", "TRACEML_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(cleared)}
    env.update(TRACEML_RUNS_DIR=str(tmp / "runs"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="4",
               TRACEML_FLUSH_INTERVAL_MS="100", **extra)
    return env


def _rank(tmp: Path, run_id: str, port: int, *args: str) -> subprocess.Popen[str]:
    """One process of job 'train', as torchrun would start rank 0 of 1."""
    env = _env(tmp, port, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TRACEML_RUN_ID=run_id,
               TRACEML_JOB="train")
    return subprocess.Popen([sys.executable, str(SCRIPTS / "lifecycle_run.py"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@dataclass
class Pages:
    server: Prometheus
    start: float
    a1_with_b_live: list[dict[str, Any]] = field(default_factory=list)
    a1_after_restart: list[dict[str, Any]] = field(default_factory=list)
    a2_ended: float = 0.0
    end: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)

    def firing(self, run_id: str, start: float | None = None) -> set[tuple[tuple[str, str], ...]]:
        """Every label set of an alert of ``run_id`` that fired at any evaluation since ``start``."""
        query = f'ALERTS{{traceml_run_id="{run_id}", alertstate="firing"}}'
        data = self.server.api("query_range", query=query, start=f"{start or self.start:.3f}",
                               end=f"{self.end:.3f}", step="1")
        drop = {"__name__", "alertstate"}
        return {tuple(sorted((k, v) for k, v in s["metric"].items() if k not in drop))
                for s in data["result"]}


def _job_failed(server: Prometheus, run_id: str) -> list[dict[str, Any]]:
    return [a for a in server.api("alerts")["alerts"] if a["labels"].get("traceml_run_id") == run_id
            and a["labels"]["alertname"] == "TraceMLJobFailed" and a["state"] == "firing"]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    tmp = tmp_path_factory.mktemp("pages")
    write_files(render_all(StackConfig(windows=Windows.short())), tmp)
    oom = free_port_pair()
    evaluation, a1, b1, a2 = (free_port(avoid=(oom, oom + 1)) for _ in range(4))
    while len({evaluation, a1, b1, a2}) < 4:
        evaluation, a1, b1, a2 = (free_port(avoid=(oom, oom + 1)) for _ in range(4))
    plain = [f"127.0.0.1:{p}" for p in (oom, oom + 1, evaluation)]
    scrape = {"job_name": "traceml", "static_configs": [
        {"targets": plain},
        {"targets": [f"127.0.0.1:{a1}", f"127.0.0.1:{a2}"], "labels": {"namespace": "team-a"}},
        {"targets": [f"127.0.0.1:{b1}"], "labels": {"namespace": "team-b"}},
    ]}
    server = start_prometheus(tmp / "prom", [scrape], rules_dir=tmp / "prometheus",
                              port=free_port(avoid=(oom, oom + 1, evaluation, a1, b1, a2)))
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        server.wait_ready()
        run = Pages(server, time.time())
        procs["oom"] = subprocess.Popen(
            [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "oom", "--nproc-per-node", "2",
             str(KILLED), "1", "40", "100000"], env=_env(tmp, oom), cwd=tmp,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs["eval"] = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "marked_evaluation.py"), "16"],
            env=_env(tmp, evaluation, TRACEML_RUN_ID="eval", TRACEML_HANG_TIMEOUT_S="3"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs["a-1"] = _rank(tmp, "a-1", a1, "--seconds", "3", "--raise-oom")
        wait_for(lambda: bool(_job_failed(server, "a-1")), 120, "a-1's failure did not page", server.log)
        procs["b-1"] = _rank(tmp, "b-1", b1, "--seconds", "12")
        wait_for(lambda: bool(server.query('traceml_run_ended{traceml_run_id="b-1"} == 0')), 120,
                 "b-1 never reported", server.log)
        time.sleep(3)  # evaluations with b-1 live
        run.a1_with_b_live = _job_failed(server, "a-1")
        procs["a-2"] = _rank(tmp, "a-2", a2, "--seconds", "5")
        wait_for(lambda: not _job_failed(server, "a-1"), 120, "the restart did not clear a-1's page",
                 server.log)
        for name in ("a-2", "oom", "eval", "b-1"):
            out, _ = procs[name].communicate(timeout=240)
            run.outputs[name] = out
            if name == "a-2":
                run.a2_ended = time.time()
        time.sleep(8)  # past every for: of the short profile with every endpoint gone
        run.end = time.time()
        out, _ = procs["a-1"].communicate(timeout=60)
        run.outputs["a-1"] = out
        yield run
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
        server.stop()


def test_a_sigkilled_rank_pages_once_naming_it(pages: Pages) -> None:
    critical = [dict(labels) for labels in pages.firing("oom") if dict(labels)["severity"] == "critical"]
    assert critical, pages.outputs["oom"][-3000:]
    assert {a["alertname"] for a in critical} == {"TraceMLJobFailed"}, critical
    named = [(a["traceml_rank"], a.get("traceml_first_failure_reason")) for a in critical]
    assert named == [("1", "SIGKILL")], critical


def test_a_marked_evaluation_longer_than_the_stall_window_never_pages(pages: Pages) -> None:
    assert "done" in pages.outputs["eval"], pages.outputs["eval"][-3000:]
    assert pages.firing("eval") == set()


def test_same_job_in_another_namespace_does_not_silence_a_failure(pages: Pages) -> None:
    (page,) = pages.a1_with_b_live
    assert page["labels"]["namespace"] == "team-a" and page["labels"]["severity"] == "critical", page


def test_a_restarts_clean_end_does_not_bring_the_old_page_back(pages: Pages) -> None:
    assert pages.firing("a-1", pages.a2_ended - 2) == set()
    assert pages.firing("a-2") == set() and pages.firing("b-1") == set()
