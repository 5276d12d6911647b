"""The communication split's alerts on a real Prometheus, against real 2-rank gloo DDP jobs.

    .venv/bin/python benchmarks/communication_alerts_live.py [--only NAME ...] [--max-seconds 150]

Renders the rules with ``traceml stack render --profile short`` (20 s rate window, 6 s ``for``),
starts Prometheus 2.42 (1 s scrape and evaluation) and runs each scenario under
``traceml run --nproc-per-node 2`` with the direct scrape endpoint, one after the other:

- ``slow_rank``: ``slow_rank.py --ddp`` with rank 1's forward 40 ms slower; expected:
  ``TraceMLSyncStraggler`` on rank 1, and never ``TraceMLCommunicationBound``;
- ``bandwidth``: ``communication_bound.py`` (~38 MiB of gradients, tiny compute); expected:
  ``TraceMLCommunicationBound`` with the bandwidth text;
- ``latency``: ``tiny_collectives.py`` (48 one-element all-reduces a step); expected:
  ``TraceMLCommunicationBound`` with the latency text;
- ``healthy``: ``slow_rank.py --ddp`` with both ranks' forward 40 ms long (balanced, compute-heavy);
  expected: neither alert.

A scenario stops (SIGINT to its process group) once it has stepped for ``--observe-seconds`` (the
20 s rate window, the 6 s ``for`` and some) and its expected alerts have fired, or at
``--max-seconds``. Prints one line per
scenario and exits 1 when any missed its expectation. Kept out of the test suite: about 3 minutes.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.test_stack_live import Prometheus, start_prometheus  # noqa: E402
from tests.ports import free_port_pair  # noqa: E402
from traceml_otel.stack import StackConfig, Windows, render_all, write_files  # noqa: E402

SCENARIOS_DIR = REPO / "examples" / "diagnosis"
COMM, STRAGGLER = "TraceMLCommunicationBound", "TraceMLSyncStraggler"
BANDWIDTH, LATENCY = "The bytes cost (bandwidth)", "Latency, not bytes, is the cost"


@dataclass
class Scenario:
    name: str
    script: str
    args: tuple[str, ...]
    env: dict[str, str]
    expect: dict[str, str]
    """Alert name -> a phrase its description must hold ("" for any); the other of the two stays quiet."""
    rank: str | None = None
    """The rank TraceMLSyncStraggler must name."""
    port: int = 0
    fired: dict[str, set[str]] = field(default_factory=dict)
    ranks: set[str] = field(default_factory=set)


SCENARIOS = (
    Scenario("slow_rank", "slow_rank.py", ("--steps", "100000", "--ddp"),
             {"SLOW_RANK_DELAY_MS": "40"}, {STRAGGLER: ""}, rank="1"),
    Scenario("bandwidth", "communication_bound.py", ("--steps", "100000"), {}, {COMM: BANDWIDTH}),
    Scenario("latency", "tiny_collectives.py", ("--steps", "100000"), {}, {COMM: LATENCY}),
    Scenario("healthy", "slow_rank.py", ("--steps", "100000", "--ddp"),
             {"SLOW_RANK_DELAY_MS": "0", "SLOW_RANK_BASE_MS": "40"}, {}),
)


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port


def _observe(prometheus: Prometheus, scenario: Scenario) -> None:
    for alert in prometheus.api("alerts")["alerts"]:
        labels = alert["labels"]
        if labels.get("traceml_run_id") != scenario.name or alert["state"] != "firing":
            continue
        if labels["alertname"] in (COMM, STRAGGLER):
            scenario.fired.setdefault(labels["alertname"], set()).add(alert["annotations"]["description"])
            if labels["alertname"] == STRAGGLER:
                scenario.ranks.add(labels.get("traceml_rank", "?"))


def _run(prometheus: Prometheus, scenario: Scenario, tmp: Path, args: argparse.Namespace) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(scenario.env, TRACEML_RUNS_DIR=str(tmp / "runs"), TRACEML_PROMETHEUS_PORT=str(scenario.port),
               TRACEML_FLUSH_INTERVAL_MS="100", TRACEML_PROMETHEUS_LINGER_S="3",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    process = subprocess.Popen(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", "--run-id", scenario.name,
         str(SCENARIOS_DIR / scenario.script), "--nproc-per-node", "2", "--", *scenario.args],
        env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    started = time.monotonic()
    stepping_since = None
    try:
        while time.monotonic() - started < args.max_seconds and process.poll() is None:
            time.sleep(1)
            _observe(prometheus, scenario)
            if stepping_since is None and prometheus.query(
                f'run:traceml_steps:rate{{traceml_run_id="{scenario.name}"}}'
            ):
                stepping_since = time.monotonic()
            if (stepping_since is not None and time.monotonic() - stepping_since >= args.observe_seconds
                    and set(scenario.expect) <= set(scenario.fired)):
                break
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return time.monotonic() - started


def _verdict(scenario: Scenario) -> tuple[bool, str]:
    problems = []
    for name in (COMM, STRAGGLER):
        if name in scenario.expect:
            texts = scenario.fired.get(name, set())
            if not texts:
                problems.append(f"{name} did not fire")
            elif not all(scenario.expect[name] in text for text in texts):
                problems.append(f"{name} text lacks {scenario.expect[name]!r}")
        elif name in scenario.fired:
            problems.append(f"{name} fired")
    if scenario.rank is not None and scenario.ranks != {scenario.rank}:
        problems.append(f"straggler ranks {sorted(scenario.ranks)}")
    return not problems, "; ".join(problems) or "as expected"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="scenario names")
    parser.add_argument("--max-seconds", type=float, default=150.0)
    parser.add_argument("--observe-seconds", type=float, default=45.0,
                        help="seconds of stepping each scenario gets at least")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if args.only is None or s.name in args.only]
    taken: set[int] = set()
    for scenario in chosen:
        scenario.port = free_port_pair()
        taken |= {scenario.port, scenario.port + 1}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        write_files(render_all(StackConfig(windows=Windows.short())), tmp)
        targets = [f"127.0.0.1:{p}" for s in chosen for p in (s.port, s.port + 1)]
        prometheus = start_prometheus(tmp, _free_port(taken),
                                      [{"job_name": "traceml", "static_configs": [{"targets": targets}]}])
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.3)
            failed = 0
            for scenario in chosen:
                seconds = _run(prometheus, scenario, tmp, args)
                ok, why = _verdict(scenario)
                failed += not ok
                fired = ", ".join(
                    f"{name}" + (f" rank {'/'.join(sorted(scenario.ranks))}" if name == STRAGGLER else "")
                    + (" (bandwidth text)" if any(BANDWIDTH in t for t in texts) else "")
                    + (" (latency text)" if any(LATENCY in t for t in texts) else "")
                    for name, texts in sorted(scenario.fired.items())
                ) or "none"
                outcome = "OK" if ok else "MISS"
                print(f"{scenario.name:10s} {seconds:5.0f} s  fired: {fired}  -> {outcome}: {why}",
                      flush=True)
        finally:
            prometheus.proc.terminate()
            prometheus.proc.wait(timeout=15)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
