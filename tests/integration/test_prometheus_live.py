"""A real Prometheus (2.42 here) scrapes our metric families, loads the rules, and answers the dashboard.

A prometheus_client endpoint on 127.0.0.1 stands in for the collector's prometheus exporter:
same names and labels as the contract's Prometheus forms, OpenMetrics with exemplars. Four
ranks step every 50 ms; rank 3 is 30 % slower.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tests.integration.otlp_stack import free_port
from tests.integration.stack_files import (
    ALERTS,
    PROMETHEUS_DIR,
    RECORDING,
    load_dashboard,
    load_yaml,
    prometheus_exprs,
    rules,
    substitute_grafana_vars,
)

PROMETHEUS = shutil.which("prometheus")
RUN_ID = "live-run"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
)


class FakeTraining:
    """Our metric families in a prometheus_client registry, fed by a background thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["traceml_run_id", "traceml_rank"]
        self.step = Histogram(
            "traceml_step_duration_seconds", "step", labels, buckets=BUCKETS, registry=self.registry
        )
        self.phase = Histogram(
            "traceml_phase_duration_seconds",
            "phase",
            [*labels, "traceml_phase_name"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.wait = Gauge("traceml_input_wait_duration_seconds", "wait", labels, registry=self.registry)
        self.reserved = Gauge("traceml_cuda_memory_peak_reserved_bytes", "r", labels, registry=self.registry)
        self.allocated = Gauge(
            "traceml_cuda_memory_peak_allocated_bytes", "a", labels, registry=self.registry
        )
        self.wait_hist = Histogram(
            "traceml_step_input_wait_seconds", "wait", labels, buckets=BUCKETS, registry=self.registry
        )
        self.ended = Gauge("traceml_run_ended", "ended", labels, registry=self.registry)
        self.steps = Counter("traceml_steps", "steps", labels, registry=self.registry)
        self.dropped = Counter("traceml_export_dropped_spans", "dropped", labels, registry=self.registry)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.step_number = 0

    def one_step(self) -> None:
        n = self.step_number = self.step_number + 1
        for rank in range(4):
            lab = {"traceml_run_id": RUN_ID, "traceml_rank": str(rank)}
            traced = 0.13 if rank == 3 else 0.1
            trace_id = f"{n:016x}{rank:016x}"
            self.step.labels(**lab).observe(
                traced, exemplar={"trace_id": trace_id, "span_id": f"{rank + 1:016x}"}
            )
            for phase, seconds in (("forward", 0.03), ("backward", 0.05), ("optimizer", 0.01)):
                self.phase.labels(**lab, traceml_phase_name=phase).observe(seconds)
            self.wait.labels(**lab).set(0.005)
            self.wait_hist.labels(**lab).observe(0.005)
            self.ended.labels(**lab).set(0)
            self.reserved.labels(**lab).set(8e9 + n * 1e6)
            self.allocated.labels(**lab).set(6e9)
            self.steps.labels(**lab).inc()
            self.dropped.labels(**lab).inc(0)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.one_step()

    def start(self) -> None:
        self.one_step()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def api_ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.log}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])


def wait_until(check: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    """Poll ``check`` (an HTTP error counts as not yet); fail with the server's log on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:  # URLError, HTTPError 503 while starting, connection refused
            pass
        time.sleep(0.1)
    pytest.fail(f"{what} within {timeout} s; prometheus log:\n{log.read_text(errors='replace')[-3000:]}")


def write_config(path: Path, target_port: int) -> None:
    """The repo's prometheus.yml (same rule files), scraping our fake exporter every second."""
    config = load_yaml(PROMETHEUS_DIR / "prometheus.yml")
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(PROMETHEUS_DIR / f) for f in config["rule_files"]]
    (collector_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "otel-collector"]
    collector_job["static_configs"] = [{"targets": [f"127.0.0.1:{target_port}"]}]
    config["scrape_configs"] = [collector_job]
    path.write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("prometheus")
    training = FakeTraining()
    exporter_port = free_port()
    httpd, _ = start_http_server(exporter_port, addr="127.0.0.1", registry=training.registry)
    training.start()
    write_config(tmp / "prometheus.yml", exporter_port)
    port = free_port()
    log = tmp / "prometheus.log"
    assert PROMETHEUS is not None
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={tmp / 'data'}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_until(lambda: server.api_ready(), 10, "prometheus not ready", log)
        # Prometheus 2.x waits ~5 s before its first scrape; three scrapes give every rate() in
        # the dashboard and the rules enough samples.
        wait_until(
            lambda: bool(server.query("count_over_time(traceml_steps_total[1m]) >= 3")),
            15,
            "prometheus did not scrape three times",
            log,
        )
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        training.stop()
        httpd.shutdown()
        httpd.server_close()


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


def test_every_dashboard_query_returns_data(prometheus: PrometheusServer) -> None:
    for expr in prometheus_exprs(load_dashboard()):
        promql = substitute_grafana_vars(expr, RUN_ID, rate_interval="10s")
        assert finite_values(prometheus.query(promql)), f"no data for {promql}"


def test_step_time_quantiles_by_rank(prometheus: PrometheusServer) -> None:
    expr = (
        "histogram_quantile(0.95, sum by (traceml_rank, le) "
        f'(rate(traceml_step_duration_seconds_bucket{{traceml_run_id="{RUN_ID}"}}[10s])))'
    )
    by_rank = {r["metric"]["traceml_rank"]: float(r["value"][1]) for r in prometheus.query(expr)}
    assert set(by_rank) == {"0", "1", "2", "3"}
    assert all(0.05 < v <= 0.1 for rank, v in by_rank.items() if rank != "3")  # the (0.05, 0.1] bucket
    assert 0.1 < by_rank["3"] <= 0.25


def test_run_id_variable_lists_the_run(prometheus: PrometheusServer) -> None:
    values = prometheus.api("label/traceml_run_id/values", **{"match[]": "traceml_steps_total"})
    assert values == [RUN_ID]


def test_exemplars_carry_trace_ids(prometheus: PrometheusServer) -> None:
    now = time.time()
    data = prometheus.api(
        "query_exemplars",
        query="traceml_step_duration_seconds_bucket",
        start=str(now - 120),
        end=str(now + 1),
    )
    trace_ids = {e["labels"]["trace_id"] for series in data for e in series["exemplars"]}
    assert trace_ids and all(len(t) == 32 for t in trace_ids)


def test_rules_load_and_evaluate(prometheus: PrometheusServer) -> None:
    def evaluated() -> list[dict[str, Any]]:
        loaded = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return loaded if all(not r["lastEvaluation"].startswith("0001") for r in loaded) else []

    wait_until(lambda: bool(evaluated()), 10, "rules not evaluated", prometheus.log)
    loaded = evaluated()
    assert {r["name"] for r in loaded} == {
        r.get("alert") or r["record"] for r in [*rules(RECORDING), *rules(ALERTS)]
    }
    assert [r for r in loaded if r["health"] != "ok"] == []


def test_recording_rules_see_the_slow_rank(prometheus: PrometheusServer) -> None:
    wait_until(
        lambda: len(prometheus.query("run_rank:traceml_step_duration_seconds:skew")) == 4,
        10,
        "skew not recorded",
        prometheus.log,
    )
    skew = {
        r["metric"]["traceml_rank"]: float(r["value"][1])
        for r in prometheus.query("run_rank:traceml_step_duration_seconds:skew")
    }
    assert skew["3"] == pytest.approx(0.3, abs=0.02)
    assert all(abs(skew[rank]) < 0.02 for rank in "012")
    share = prometheus.query("run:traceml_input_wait_share:median")
    assert [float(r["value"][1]) for r in share] == [pytest.approx(0.005 / 0.105, rel=0.05)]
