"""How ``traceml analyze --prometheus`` scales with ranks: N simulated ranks on a real Prometheus.

One process serves N ranks' series (the contract's Prometheus names: sum-and-count phase and
input-wait series, the step-duration histogram with buckets, steps, samples, last-step time) on one
scrape endpoint; a real Prometheus scrapes it every 5 s (1,024 ranks' exposition takes over a
second to build) for ``--seconds``; then the analysis runs in a fresh process and its wall time,
peak RSS and verdict are printed. Every rank steps every ``--step-interval`` seconds; rank 0 waits
3x longer for input than the others.

    python benchmarks/prometheus_analyze.py --ranks 1024 --seconds 90
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, start_http_server

from traceml_otel import contract as c

RUN_ID = "bench-prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(ranks: int, port: int, interval: float, stop: threading.Event) -> None:
    registry = CollectorRegistry()
    labels = ["traceml_run_id", "traceml_rank"]
    step = Histogram(
        "traceml_step_duration_seconds", "", labels, buckets=c.DURATION_BUCKETS_S, registry=registry
    )
    phase = Summary("traceml_phase_duration_seconds", "", [*labels, "traceml_phase_name"], registry=registry)
    wait = Summary("traceml_step_input_wait_seconds", "", labels, registry=registry)
    steps = Counter("traceml_steps", "", labels, registry=registry)
    samples = Counter("traceml_samples", "", labels, registry=registry)
    last = Gauge("traceml_step_last_timestamp_seconds", "", labels, registry=registry)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    series = [(str(r), {"traceml_run_id": RUN_ID, "traceml_rank": str(r)}) for r in range(ranks)]
    while not stop.is_set():
        began = time.monotonic()
        for rank, names in series:
            forward, backward, optimizer = 0.03, 0.06, 0.01
            step.labels(**names).observe(forward + backward + optimizer + 0.005 * random.random())
            for name, seconds in (("forward", forward), ("backward", backward), ("optimizer", optimizer)):
                phase.labels(**names, traceml_phase_name=name).observe(seconds)
            wait.labels(**names).observe(0.06 if rank == "0" else 0.02)
            steps.labels(**names).inc()
            samples.labels(**names).inc(64)
            last.labels(**names).set(time.time())
        stop.wait(max(0.0, interval - (time.monotonic() - began)))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--step-interval", type=float, default=1.0)
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("prometheus is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        target, port = _free_port(), _free_port()
        config = {
            "global": {"scrape_interval": "5s", "scrape_timeout": "5s"},
            "scrape_configs": [{"job_name": "sim", "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        log = open(tmp / "prometheus.log", "wb")
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={tmp / 'data'}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stop = threading.Event()
        try:
            threading.Thread(
                target=_serve, args=(args.ranks, target, args.step_interval, stop), daemon=True
            ).start()
            time.sleep(args.seconds)
            stop.set()
            time.sleep(2.0)
            started = time.monotonic()
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "traceml_otel.cli",
                    "analyze",
                    "--prometheus",
                    f"http://127.0.0.1:{port}",
                    "--run-id",
                    RUN_ID,
                    "--since",
                    "1h",
                    "--format",
                    "json",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            wall = time.monotonic() - started
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            status = f"http://127.0.0.1:{port}/api/v1/status/tsdb"
            with urllib.request.urlopen(status, timeout=10) as answer:
                head = json.load(answer)["data"]["headStats"]["numSeries"]
        finally:
            stop.set()
            server.terminate()
            server.wait(timeout=30)
            log.close()
    if result.returncode != 0:
        print(result.stderr or result.stdout[:2000], file=sys.stderr)
        return 1
    report = json.loads(result.stdout)
    print(
        f"ranks {args.ranks}, {args.seconds:g} s at 5 s scrape, {head} series in Prometheus: "
        f"analyze --prometheus "
        f"{wall:.1f} s, peak RSS {rss:.0f} MiB, verdict {report['primary_diagnosis']['kind']}, "
        f"{len(report['ranks'])} ranks, {min(r['steps'] for r in report['ranks'])}+ steps each"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
