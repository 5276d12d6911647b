"""A job's whole life on real Prometheus servers (Debian 2.42) with the short-profile rules.

Three servers share one set of real training processes (`traceml_otel.init()`, direct scrape path):
an HA pair ('a', 'b': scrape every 15 s, at their own moments: different external labels give
them different scrape phases) and 'fast' (every 1 s). Jobs, all at once:
- 'ha-clean': 2 ranks step 16 s and end cleanly with the default linger (20 s): neither replica
  of the pair may page TelemetryMissing once the endpoints are gone;
- 'crash': 2 ranks each raise torch.cuda.OutOfMemoryError: one TraceMLJobFailed page per server;
- 'nightly': attempt 1 steps at 0.05 s and is SIGKILLed (TelemetryMissing fires on 'fast'); attempt 2
  restarts under the same TRACEML_JOB with 0.07 s steps (40 % slower): the first attempt stops
  paging and drift fires against the job's baseline.
The long-window parts (a 60 s interval, an hour of lookback) are promtool cases in
prometheus/tests/job_lifecycle_test.yml.
"""

from __future__ import annotations

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

from tests.integration.conftest import SideBySide
from tests.ports import free_port, free_port_pair
from tests.prometheus_server import Prometheus, start_prometheus, static_targets
from tests.tools import requires_tool
from tests.waiting import wait_for
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

SCRIPT = Path(__file__).resolve().parent / "scripts" / "lifecycle_run.py"
pytestmark = requires_tool("prometheus")


def _start(tmp: Path, name: str, interval: str, targets: list[str]) -> Prometheus:
    """One replica (external label ``replica``) scraping ``targets`` every ``interval`` with the rules in
    ``tmp/prometheus``, evaluated every second."""
    taken = tuple(int(target.rsplit(":", 1)[1]) for target in targets)
    return start_prometheus(tmp / name, [static_targets("traceml", targets)], rules_dir=tmp / "prometheus",
                            scrape_interval=interval, external_labels={"replica": name},
                            port=free_port(avoid=taken))


def _rank(
    tmp: Path, job: str, run_id: str, rank: int, world: int, port: int, *args: str
) -> subprocess.Popen[str]:
    """One rank of ``job`` (attempt ``run_id``), as torchrun would start it."""
    cleared = ("OTEL_", "TRACEML_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(cleared)}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), TRACEML_RUN_ID=run_id,
               TRACEML_JOB=job, TRACEML_RUNS_DIR=str(tmp / "runs"), TRACEML_PROMETHEUS_PORT=str(port),
               TRACEML_FLUSH_INTERVAL_MS="100")  # the linger is the default (20 s)
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@dataclass
class Lifecycle:
    servers: dict[str, Prometheus]
    clean_targets: list[str]
    missing_fired_first: bool = False
    missing_after_restart: list[dict[str, Any]] = field(default_factory=list)
    failed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    missing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ended: dict[str, list[float]] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)


def _alerts(
    server: Prometheus, name: str, run_id: str, states: str = "firing|pending"
) -> list[dict[str, Any]]:
    """The server's alerts (labels, state, value) named ``name`` for ``run_id`` in one of ``states``."""
    return [alert for alert in server.api("alerts")["alerts"]
            if alert["labels"].get("alertname") == name and alert["labels"].get("traceml_run_id") == run_id
            and alert["state"] in states.split("|")]


def _targets_down(server: Prometheus, targets: list[str], since: float) -> bool:
    active = server.api("targets")["activeTargets"]
    state = {t["labels"]["instance"]: t for t in active}
    return all(
        state[target]["health"] == "down"
        and time.mktime(time.strptime(state[target]["lastScrape"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        > since
        for target in targets
    )


@pytest.fixture(scope="module")
def lifecycle(side_by_side: SideBySide) -> Iterator[Lifecycle]:
    """The scenario below, run side by side with test_stack_live.py's (tests/integration/conftest.py)."""
    yield side_by_side.result(__name__)
    side_by_side.close(__name__)


def lifecycle_scenario(tmp: Path, settled: threading.Event | None = None) -> Iterator[Lifecycle]:
    """Three Prometheus replicas and three jobs' ranks: driven through the scenario (see :func:`_observe`),
    then yielded; everything stops when it is closed."""
    # the short profile, with the drift windows halved again (the restart must fire within the run)
    windows = Windows.short().with_overrides({"rate": "10s", "baseline_min_history": "5s", "for_drift": "4s"})
    write_files(render_all(StackConfig(windows=windows)), tmp)
    clean, crash, first, second = free_port_pair(), free_port_pair(), free_port(), free_port()
    clean_targets = [f"127.0.0.1:{clean}", f"127.0.0.1:{clean + 1}"]
    targets = [*clean_targets, f"127.0.0.1:{crash}", f"127.0.0.1:{crash + 1}",
               f"127.0.0.1:{first}", f"127.0.0.1:{second}"]
    servers = {name: _start(tmp, name, interval, targets)
               for name, interval in (("a", "15s"), ("b", "15s"), ("fast", "1s"))}
    ranks: list[subprocess.Popen[str]] = []
    try:
        for server in servers.values():
            server.wait_ready()
        run = Lifecycle(servers, clean_targets)
        ranks += [_rank(tmp, "ha-clean", "ha-clean", r, 2, clean, "--seconds", "16") for r in (0, 1)]
        ranks += [_rank(tmp, "crash", "crash", r, 2, crash, "--seconds", "8", "--raise-oom") for r in (0, 1)]
        attempt1 = _rank(tmp, "nightly", "nightly-1", 0, 1, first, "--seconds", "120", "--step", "0.05")
        ranks.append(attempt1)
        _observe(run, tmp, ranks, attempt1, second, settled or threading.Event())
        yield run
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.communicate(timeout=30)
        for server in servers.values():
            server.stop()


def _observe(run: Lifecycle, tmp: Path, ranks: list[subprocess.Popen[str]],
             attempt1: subprocess.Popen[str], second_port: int, settled: threading.Event) -> None:
    """Drive the scenario; ``settled`` is set once every trainer has started (the restart is live)."""
    fast = run.servers["fast"]
    # attempt 1 builds the job's baseline (5 s of means here), then dies
    wait_for(lambda: bool(fast.query('job:traceml_step_time_seconds:baseline{traceml_job="nightly"}')),
               120, "no baseline for job nightly", fast.log)
    time.sleep(3)
    attempt1.send_signal(signal.SIGKILL)
    wait_for(lambda: bool(_alerts(fast, "TraceMLTelemetryMissing", "nightly-1", "firing")), 30,
               "the killed attempt did not page TelemetryMissing", fast.log)
    run.missing_fired_first = True
    attempt2 = _rank(tmp, "nightly", "nightly-2", 0, 1, second_port, "--seconds", "120", "--step", "0.07")
    ranks.append(attempt2)
    wait_for(lambda: bool(fast.query('run:traceml_live_ranks:count{traceml_run_id="nightly-2"}')), 60,
             "the restart is not live (a process start on a loaded machine)", fast.log)
    settled.set()
    wait_for(lambda: not _alerts(fast, "TraceMLTelemetryMissing", "nightly-1"), 10,
             "the killed attempt still pages with the restart live", fast.log)
    run.missing_after_restart = _alerts(fast, "TraceMLTelemetryMissing", "nightly-1")
    wait_for(lambda: bool(_alerts(fast, "TraceMLStepTimeDrift", "nightly-2", "firing")), 45,
               "the 40 % slower restart did not fire drift", fast.log)
    run.drift = _alerts(fast, "TraceMLStepTimeDrift", "nightly-2", "firing")
    # the clean job: wait until both replicas found its endpoints closed, then past `for:` and more
    for rank in ranks[:4]:
        rank.wait(timeout=90)
    closed = time.time()
    for name in ("a", "b"):
        server = run.servers[name]
        wait_for(lambda s=server: _targets_down(s, run.clean_targets, closed), 40,
                   f"replica {name} did not scrape the closed endpoints", server.log)
    time.sleep(5)  # two evaluations past for_missing (3 s)
    for name, server in run.servers.items():
        run.failed[name] = _alerts(server, "TraceMLJobFailed", "crash", "firing")
        run.missing[name] = [*_alerts(server, "TraceMLTelemetryMissing", "ha-clean"),
                             *_alerts(server, "TraceMLTelemetryMissing", "crash")]
        run.ended[name] = [float(r["value"][1]) for r in server.query(
            'last_over_time(traceml_run_ended{traceml_run_id="ha-clean"}[5m])')]


def test_a_clean_end_pages_neither_replica_of_an_ha_pair(lifecycle: Lifecycle) -> None:
    for name in ("a", "b", "fast"):
        assert lifecycle.missing[name] == [], (name, lifecycle.missing[name])
        assert lifecycle.ended[name] == [1.0, 1.0], name  # each replica scraped both ranks' end marker


def test_every_rank_raising_gives_one_failed_job_page(lifecycle: Lifecycle) -> None:
    for name in ("a", "b", "fast"):
        (page,) = lifecycle.failed[name]
        assert page["labels"]["traceml_job"] == "crash" and page["labels"]["severity"] == "critical"
        assert float(page["value"]) == 2  # both ranks, one page


def test_restart_under_the_same_job_fires_drift_and_silences_the_first_attempt(lifecycle: Lifecycle) -> None:
    assert lifecycle.missing_fired_first  # the killed attempt paged ...
    assert lifecycle.missing_after_restart == []  # ... until the restart was live
    (drift,) = lifecycle.drift
    assert drift["labels"]["traceml_job"] == "nightly" and drift["labels"]["traceml_run_id"] == "nightly-2"
    assert float(drift["value"]) > 1.2
