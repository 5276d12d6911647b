"""A real Prometheus (Debian 2.42) runs the rendered short-window rules against real training runs.

Two `traceml_otel.init()` training processes serve their metrics on the direct scrape path
(TRACEML_PROMETHEUS_PORT): 'drift' steps at 0.05 s, then at 0.12 s (the slowdown), then ends
cleanly; 'loader' waits on a slow data loader, and is SIGKILLed once its alert fired. Beside
them Prometheus scrapes a static exposition in NVIDIA DCGM exporter format and, where installed,
a real node-exporter. The rules are `traceml stack render --profile short` (the shipped logic
with second-long windows), evaluated every second.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import SideBySide
from tests.integration.stack_files import prometheus_exprs, substitute_grafana_vars
from tests.ports import free_port
from tests.prometheus_server import Prometheus, serve_exposition, start_prometheus, static_targets
from tests.tools import NODE_EXPORTER, requires_tool
from tests.waiting import wait_for
from traceml_otel import contract as c
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

SCRIPT = Path(__file__).resolve().parent / "scripts" / "stack_run.py"
GPU_UUID = "GPU-5fb2a1c4-7d7e-4c1b-9f0e-1a2b3c4d5e6f"
OTHER_GPU_UUID = "GPU-00000000-0000-0000-0000-000000000000"
FAST_S, SLOW_S = 30.0, 20.0
DRIFT_STEP_S, DRIFT_SLOW_STEP_S = 0.1, 0.25
"""The drift run's traced seconds a step before and after its slowdown (a CI run under the suite's load
went pending before the slowdown with 0.05 s steps: each wake-up from the sleep waited for a CPU)."""
DRIFT_FLOPS = 1e10
"""Model FLOPs each of the drift run's steps declares (peak 1e12): MFU about 1e10 / 0.105 s / 1e12."""
pytestmark = requires_tool("prometheus")

# The DCGM exporter's exposition (its documented metric and label names): this run's GPU and
# another node's, which the join must leave out.
DCGM_EXPOSITION = "".join(
    f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
    + "".join(
        f'{name}{{gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",'
        f'Hostname="{host}",DCGM_FI_DRIVER_VERSION="550.54.15"}} {value}\n'
        for gpu, uuid, host, value in (
            (0, GPU_UUID, "trainer-host", base),
            (1, OTHER_GPU_UUID, "other", base / 2),
        )
    )
    for name, help_text, base in (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 87),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 41),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 512.5),
    )
)


def finite(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


@dataclass
class LiveRun:
    """What happened, collected once for the tests below."""

    prometheus: Prometheus
    rules_dir: Path
    drift_port: int
    started: float
    slowdown: float = 0.0
    drift_ended: float = 0.0
    loader_killed: float = 0.0
    dashboard: dict[str, list[float]] = field(default_factory=dict)
    exemplars: list[dict[str, Any]] = field(default_factory=list)
    drift_steps: int = 0
    time_categories: list[dict[str, Any]] = field(default_factory=list)


def _trainer(name: str, port: int, runs_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(
        TRACEML_RUN_ID=name,
        TRACEML_RUNS_DIR=str(runs_dir),
        TRACEML_PROMETHEUS_PORT=str(port),
        TRACEML_FLUSH_INTERVAL_MS="100",
        TRACEML_PROMETHEUS_LINGER_S="10",
        TRACEML_PEAK_FLOPS="1e12",
    )
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def live(side_by_side: SideBySide) -> Iterator[LiveRun]:
    """The scenario below, run side by side with the lifecycle test's (tests/integration/conftest.py)."""
    yield side_by_side.result(__name__)
    side_by_side.close(__name__)


def live_scenario(tmp: Path, settled: threading.Event | None = None) -> Iterator[LiveRun]:
    """Two trainers, the DCGM exposition and a node exporter, scraped by one Prometheus: driven through
    the scenario (see :func:`_observe`), then yielded; everything stops when it is closed."""
    write_files(render_all(StackConfig(windows=Windows.short())), tmp)
    drift_port = free_port()
    loader_port = free_port(avoid=(drift_port,))
    node_port = free_port(avoid=(drift_port, loader_port))
    dcgm = serve_exposition(DCGM_EXPOSITION.encode)
    dcgm_port = dcgm.server_address[1]
    node = None
    if NODE_EXPORTER:
        node = subprocess.Popen(
            [
                NODE_EXPORTER,
                f"--web.listen-address=127.0.0.1:{node_port}",
                "--collector.disable-defaults",
                "--collector.cpu",
                "--collector.uname",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    prometheus = start_prometheus(
        tmp,
        [static_targets("traceml", [f"127.0.0.1:{drift_port}", f"127.0.0.1:{loader_port}"]),
         static_targets("dcgm", [f"127.0.0.1:{dcgm_port}"]),
         static_targets("node", [f"127.0.0.1:{node_port}"])],
        rules_dir=tmp / "prometheus", flags=["--enable-feature=exemplar-storage"],
        port=free_port(avoid=(drift_port, loader_port, node_port)),
    )
    trainers: list[subprocess.Popen[str]] = []
    try:
        prometheus.wait_ready()
        run = LiveRun(prometheus, tmp / "prometheus", drift_port, started=time.time())
        drift = _trainer(
            "drift",
            drift_port,
            tmp / "runs",
            "--fast-seconds",
            str(FAST_S),
            "--slow-seconds",
            str(SLOW_S),
            "--gpu-uuid",
            GPU_UUID,
            "--step",  # long enough that a loaded CI machine's wake-up delays stay well under drift's 20 %
            str(DRIFT_STEP_S),
            "--slow-step",
            str(DRIFT_SLOW_STEP_S),
            "--flops",
            str(DRIFT_FLOPS),
            "--evaluate-every",
            "100",
        )
        loader = _trainer(
            "loader",
            loader_port,
            tmp / "runs",
            "--fast-seconds",
            "120",
            "--step",
            "0.03",
            "--loader-wait",
            "0.03",
        )
        trainers += [drift, loader]
        _observe(run, drift, loader)
        yield run
    finally:
        for trainer in trainers:
            if trainer.poll() is None:
                trainer.kill()
            trainer.communicate(timeout=30)
        prometheus.stop()
        if node is not None:
            node.terminate()
            node.wait(timeout=10)
        dcgm.shutdown()
        dcgm.server_close()


def _observe(run: LiveRun, drift: subprocess.Popen[str], loader: subprocess.Popen[str]) -> None:
    """Drive the scenario: kill 'loader' once its alert fires; read the dashboard while 'drift' is slow."""
    prometheus = run.prometheus

    def alert(name: str, run_id: str, state: str = "firing") -> bool:
        return bool(
            prometheus.query(f'ALERTS{{alertname="{name}", traceml_run_id="{run_id}", alertstate="{state}"}}')
        )

    wait_for(
        lambda: alert("TraceMLInputBound", "loader"), 60, "the input-bound alert did not fire", prometheus.log
    )
    loader.send_signal(signal.SIGKILL)
    run.loader_killed = time.time()
    assert drift.stdout is not None
    line = drift.stdout.readline()
    assert line.startswith("slowdown "), line + (drift.stderr.read() if drift.stderr else "")
    run.slowdown = float(line.split()[1])
    wait_for(
        lambda: alert("TraceMLStepTimeDrift", "drift"), SLOW_S, "the drift alert did not fire", prometheus.log
    )
    dashboard = run_dashboard()
    annotations = [a["expr"] for a in dashboard["annotations"]["list"] if a.get("expr")]
    for expr in [*prometheus_exprs(dashboard), *annotations]:  # the alert annotations too (drift fires now)
        promql = substitute_grafana_vars(expr, "drift", rate_interval="10s")
        run.dashboard[expr] = finite(prometheus.query(promql))
    run.time_categories = prometheus.query('run:traceml_time_seconds:rate{traceml_run_id="drift"}')
    now = time.time()
    run.exemplars = prometheus.api(
        "query_exemplars",
        query='traceml_step_duration_seconds_bucket{traceml_run_id="drift"}',
        start=str(run.started),
        end=str(now + 1),
    )
    steps = prometheus.query('traceml_steps_total{traceml_run_id="drift"}')
    run.drift_steps = int(float(steps[0]["value"][1]))
    drift.wait(timeout=SLOW_S + 30)
    run.drift_ended = time.time()
    time.sleep(6)  # two evaluations past every `for:` of the short profile


def run_dashboard() -> dict[str, Any]:
    return json.loads(
        render_all(StackConfig(windows=Windows.short()))["grafana/dashboards/traceml-training.json"]
    )


def test_drift_goes_pending_then_firing_after_the_slowdown_and_never_before(live: LiveRun) -> None:
    p = live.prometheus
    base = 'ALERTS{alertname="TraceMLStepTimeDrift", traceml_run_id="drift", alertstate="%s"}'
    pending = p.series_times(base % "pending", live.started, live.drift_ended)
    firing = p.series_times(base % "firing", live.started, live.drift_ended)
    assert pending and firing
    assert min(pending) > live.slowdown - 1, "pending before the slowdown"
    assert min(firing) > min(pending)
    # The alert could have fired before: the baseline existed well before the slowdown.
    baseline = p.series_times(
        'job:traceml_step_time_seconds:baseline{traceml_job="drift"}', live.started, live.slowdown
    )
    assert baseline and min(baseline) < live.slowdown - 5
    # the input-bound run never drifts (its pace is constant)
    assert not p.series_times(
        'ALERTS{alertname="TraceMLStepTimeDrift", traceml_run_id="loader"}', live.started, live.drift_ended
    )


def test_clean_end_resolves_and_is_not_missing(live: LiveRun) -> None:
    p = live.prometheus
    end = time.time()
    firing = p.series_times(
        'ALERTS{alertname="TraceMLStepTimeDrift", traceml_run_id="drift", alertstate="firing"}',
        live.drift_ended + 3,
        end,
    )
    assert not firing, "the drift alert outlived the run"
    assert not p.series_times(
        'ALERTS{alertname="TraceMLTelemetryMissing", traceml_run_id="drift"}', live.started, end
    )
    assert p.series_times('traceml_run_ended{traceml_run_id="drift"} == 1', live.started, end), (
        "the end marker was never scraped (the endpoint's linger)"
    )


def test_input_bound_variant_fires_and_a_killed_run_is_missing(live: LiveRun) -> None:
    p = live.prometheus
    share = p.series_times(
        'run:traceml_input_wait_share:median{traceml_run_id="loader"} > 0.4', live.started, live.loader_killed
    )
    assert share, "input wait share of the slow loader not recorded"
    missing = 'ALERTS{alertname="TraceMLTelemetryMissing", traceml_run_id="loader", alertstate="firing"}'
    latest = live.drift_ended + 6 + 15  # the scenario's end, then up to 15 s more
    wait_for(lambda: p.series_times(missing, live.loader_killed, min(time.time(), latest)),
             max(1.0, latest - time.time()), "killed run not reported missing", p.log)
    # The kill reaches the alert through the scrape (1 s: stale markers) and the chain of rule groups
    # (raw -> rates -> means -> alerts, one 1 s evaluation each; prometheus/recording.yml), so it may
    # still read firing up to about 5 s later; a CI run saw it at 3.0 s.
    assert not p.series_times(
        'ALERTS{alertname="TraceMLInputBound", traceml_run_id="loader", alertstate="firing"}',
        live.loader_killed + 1 + 4 + 2,
        time.time(),
    ), "an alert outlived the killed run"


def test_every_dashboard_query_returns_data(live: LiveRun) -> None:
    may_be_empty = ("traceml_cuda_memory_peak", "DCGM_FI_")  # CUDA memory on CPU
    # these runs are single processes with no collectives; test_stack_communication_live.py
    # shows the Communication row against a 2-rank DDP run
    may_be_empty += ("traceml_collective_", "traceml_communication_share")
    # the ranks that dropped spans: none in a healthy run (the run's total is drawn at 0)
    may_be_empty += ("(increase(traceml_export_dropped_spans_total",)
    # no rank has an impossible MFU (the stat shows 0 then)
    may_be_empty += ("run:traceml_mfu_data_problems:count",)
    # the Status row: no end yet while the run steps, no hang in a healthy run
    may_be_empty += ("traceml_run_exit", "traceml_progress_stalled_seconds")
    if NODE_EXPORTER is None:
        may_be_empty += ("node_cpu_seconds_total",)
    empty = [
        expr
        for expr, values in live.dashboard.items()
        if not values and not any(m in expr for m in may_be_empty)
    ]
    assert not empty
    dropped = [v for e, v in live.dashboard.items() if "run:traceml_export_dropped_spans:increase" in e]
    assert dropped == [[0.0]]  # present at 0 on the direct path


def test_goodput_row_reads_this_runs_time_and_mfu(live: LiveRun) -> None:
    def values(recorded: str) -> list[float]:
        return next(v for e, v in live.dashboard.items() if e.startswith(recorded))

    names = {series["metric"]["traceml_time_category"] for series in live.time_categories}
    assert {"startup", "step.block", "step.input_wait", "between_steps", "outside.evaluation"} <= names
    (goodput,) = values("run:traceml_goodput:ratio{")
    assert 0.5 < goodput <= 1  # most of a steady run's time is in its steps
    (mfu,) = values("run:traceml_mfu:ratio{")
    assert 0.02 < mfu < 0.5, mfu  # 1e10 FLOPs per 0.1-0.26 s step over a 1e12 peak


def test_dcgm_panels_get_this_runs_gpu_through_the_info_join(live: LiveRun) -> None:
    values = {
        metric: v
        for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_POWER_USAGE")
        for e, v in live.dashboard.items()
        if metric in e
    }
    assert values == {
        "DCGM_FI_DEV_GPU_UTIL": [87.0],
        "DCGM_FI_DEV_MEM_COPY_UTIL": [41.0],
        "DCGM_FI_DEV_POWER_USAGE": [512.5],
    }  # this run's GPU only, not the other node's


@requires_tool("prometheus-node-exporter", "node_exporter")
def test_host_cpu_panel_joins_node_exporter(live: LiveRun) -> None:
    lines = [v for e, v in live.dashboard.items() if "node_cpu_seconds_total" in e]
    assert len(lines) == 3  # busiest, median and least busy host of the run: here the one host
    assert all(len(values) == 1 and 0 <= values[0] <= 1 for values in lines)


def test_exemplars_point_at_this_runs_step_traces(live: LiveRun) -> None:
    trace_ids = {e["labels"]["trace_id"] for series in live.exemplars for e in series["exemplars"]}
    assert trace_ids
    known = {f"{c.step_trace_id('drift', n):032x}" for n in range(live.drift_steps + 200)}
    assert trace_ids <= known


def test_rules_load_and_evaluate_healthy(live: LiveRun) -> None:
    loaded = [r for g in live.prometheus.api("rules")["groups"] for r in g["rules"]]
    shipped = [yaml.safe_load((Path(__file__).parents[2] / "prometheus" / name).read_text())
               for name in ("recording.yml", "alerts.yml")]
    assert len(loaded) == sum(len(g["rules"]) for f in shipped for g in f["groups"]) > 50
    assert [r["name"] for r in loaded if r["health"] != "ok"] == []
