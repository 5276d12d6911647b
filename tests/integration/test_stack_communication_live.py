"""The Communication row and TraceMLCommunicationBound against a real Prometheus and a real 2-rank DDP job.

`traceml run --nproc-per-node 2` runs a gloo DDP job whose gradients (about 38 MiB a step) are
large against its compute, with collective timing on (the default) and the direct scrape path
(TRACEML_PROMETHEUS_PORT=P: local rank 0 serves P, local rank 1 serves P+1). Prometheus 2.42
scrapes both every second and evaluates the rules of `traceml stack render --profile short`,
with its rate window and baseline history halved (`WINDOWS`) so that the job can be shorter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.stack_files import prometheus_exprs, substitute_grafana_vars
from tests.integration.test_stack_live import finite, run_dashboard
from tests.ports import free_port, free_port_pair
from tests.prometheus_server import Prometheus, start_prometheus, static_targets
from tests.tools import requires_tool
from tests.waiting import wait_for
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "comm_run.py"
RUN_ID = "comm"
RUN_SECONDS = 16.0  # steps: the alert fires after ~8 s of them; the drift baseline needs 8 s (below)
WINDOWS = {"rate": "10s", "baseline_min_history": "8s"}  # the short profile's, halved: a shorter job
pytestmark = requires_tool("prometheus")
COMMUNICATION = ("traceml_collective_", "traceml_communication_share")


@dataclass
class CommunicationRun:
    prometheus: Prometheus
    started: float
    ended: float = 0.0
    firing_at: float = 0.0
    severities: set[str] = field(default_factory=set)
    dashboard: dict[str, list[float]] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    descriptions: list[str] = field(default_factory=list)
    split: dict[str, list[dict]] = field(default_factory=dict)
    launcher_output: str = ""


def _alert(prometheus: Prometheus, state: str) -> list[dict]:
    return prometheus.query(
        f'ALERTS{{alertname="TraceMLCommunicationBound", traceml_run_id="{RUN_ID}", alertstate="{state}"}}'
    )


@pytest.fixture(scope="module")
def comm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommunicationRun]:
    tmp = tmp_path_factory.mktemp("stack-comm")
    write_files(render_all(StackConfig(windows=Windows.short().with_overrides(WINDOWS))), tmp)
    port = free_port_pair()
    ranks = [f"127.0.0.1:{p}" for p in (port, port + 1)]
    prometheus = start_prometheus(tmp, [static_targets("traceml", ranks)], rules_dir=tmp / "prometheus",
                                  port=free_port(avoid=(port, port + 1)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(
        TRACEML_RUN_ID=RUN_ID,
        TRACEML_RUNS_DIR=str(tmp / "runs"),
        TRACEML_PROMETHEUS_PORT=str(port),
        TRACEML_FLUSH_INTERVAL_MS="100",
        TRACEML_PROMETHEUS_LINGER_S="3",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    launcher = None
    try:
        prometheus.wait_ready()
        run = CommunicationRun(prometheus, started=time.time())
        baseline = f'job:traceml_step_time_seconds:baseline{{traceml_job="{RUN_ID}"}}'
        share = f'run_rank:traceml_communication_share:ratio{{traceml_run_id="{RUN_ID}"}}'
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "traceml_otel.cli",
                "run",
                str(SCRIPT),
                "--nproc-per-node",
                "2",
                "--",
                "--seconds",
                str(RUN_SECONDS),
            ],
            env=env,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # the alert fires, and the drift baseline exists, so every panel has something to show
        wait_for(
            lambda: bool(_alert(prometheus, "firing")) and bool(prometheus.query(baseline)),
            RUN_SECONDS + 30,  # + the launcher's start (torch import, process group)
            "TraceMLCommunicationBound did not fire during the run",
            prometheus.log,
        )
        run.firing_at = time.time()
        run.severities = {a["metric"]["severity"] for a in _alert(prometheus, "firing")}
        for expr in prometheus_exprs(run_dashboard()):
            run.dashboard[expr] = finite(prometheus.query(substitute_grafana_vars(expr, RUN_ID, "10s")))
        run.shares = {r["metric"]["traceml_rank"]: float(r["value"][1]) for r in prometheus.query(share)}
        run.descriptions = [
            a["annotations"]["description"] for a in prometheus.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "TraceMLCommunicationBound" and a["state"] == "firing"
        ]
        for name in ("run:traceml_communication_transfer_seconds:per_step",
                     "run_rank:traceml_communication_waiting_seconds:per_step",
                     "run:traceml_collective_bytes_per_call:mean", "run:traceml_collective_calls:per_step"):
            run.split[name] = prometheus.query(f'{name}{{traceml_run_id="{RUN_ID}"}}')
        run.launcher_output, _ = launcher.communicate(timeout=RUN_SECONDS + 60)
        assert launcher.returncode == 0, run.launcher_output
        run.ended = time.time()
        time.sleep(4)  # past the endpoints' linger and two evaluations
        yield run
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=30)
        prometheus.stop()


def test_communication_bound_fires_on_a_real_ddp_job(comm: CommunicationRun) -> None:
    assert set(comm.shares) == {"0", "1"}, comm.shares  # one series per rank: both endpoints scraped
    least = min(comm.shares.values())
    assert least >= 0.1, comm.shares
    assert comm.severities == {"warning"}  # a performance finding never pages critical (fires from 0.20)
    # the transfer, not waiting: the advice is the bandwidth regime's (about 38 MiB in 1-2 buckets a step)
    assert comm.descriptions and all("The bytes cost (bandwidth)" in d for d in comm.descriptions)
    assert not any("Latency, not bytes" in d for d in comm.descriptions), comm.descriptions
    (per_call,) = [float(r["value"][1]) for r in comm.split["run:traceml_collective_bytes_per_call:mean"]]
    assert per_call >= 1 << 20
    transfer_series = comm.split["run:traceml_communication_transfer_seconds:per_step"]
    (transfer,) = [float(r["value"][1]) for r in transfer_series]
    waiting = {r["metric"]["traceml_rank"]: float(r["value"][1])
               for r in comm.split["run_rank:traceml_communication_waiting_seconds:per_step"]}
    assert transfer > 0 and set(waiting) == {"0", "1"} and min(waiting.values()) == 0.0
    assert comm.split["run:traceml_collective_calls:per_step"]
    # the same finding in the analyzer's report of the same run
    assert "COMMUNICATION" in comm.launcher_output.upper(), comm.launcher_output


def test_communication_panels_return_data(comm: CommunicationRun) -> None:
    panels = {e: v for e, v in comm.dashboard.items() if any(m in e for m in COMMUNICATION)}
    assert len(panels) == 6  # share: selected ranks, least-waiting, median, max; total and exposed by kind
    assert all(panels.values()), panels
    share = next(v for e, v in panels.items()
                 if "run_rank:traceml_communication_share:ratio" in e and "traceml_rank=~" in e)
    assert len(share) == 2 and all(0 < s < 1 for s in share)
    (total,) = [v for e, v in panels.items() if "run:traceml_collective_seconds:per_step" in e]
    (exposed,) = [v for e, v in panels.items() if "run:traceml_collective_exposed_seconds:per_step" in e]
    assert len(total) == len(exposed) == 1  # ddp all_reduce only
    assert 0 < exposed[0] <= total[0] * 1.001


def test_every_other_panel_returns_data_on_cpu(comm: CommunicationRun) -> None:
    # no GPU, and no node-exporter in this test (test_stack_live.py joins a real one)
    may_be_empty = ("traceml_cuda_memory_peak", "DCGM_FI_", "node_cpu_seconds_total",
                    "(increase(traceml_export_dropped_spans_total",  # ranks that dropped: none here
                    "traceml_mfu",  # the job declares no FLOPs (test_stack_live.py's does)
                    "traceml_run_exit", "traceml_progress_stalled_seconds")  # running, not hung
    empty = [e for e, v in comm.dashboard.items() if not v and not any(m in e for m in may_be_empty)]
    assert not empty


def test_alert_resolves_at_the_end_of_the_job(comm: CommunicationRun) -> None:
    p = comm.prometheus
    firing = (
        f'ALERTS{{alertname="TraceMLCommunicationBound", traceml_run_id="{RUN_ID}", alertstate="firing"}}'
    )
    assert p.series_times(firing, comm.started, comm.ended)
    assert not p.series_times(firing, comm.ended + 3, time.time()), "the alert outlived the job"
    assert not p.query(f'ALERTS{{alertname="TraceMLCommunicationBound", traceml_run_id="{RUN_ID}"}}')
