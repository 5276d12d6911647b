"""A clean 2-rank end seen by a Prometheus that scrapes every 60 s, with the default linger.

The slow part of the lifecycle proof, kept out of the test suite (about 4 minutes): the job steps
until that Prometheus has scraped it twice (so the endpoint has seen its 60 s interval), then ends
cleanly with TRACEML_PROMETHEUS_LINGER_S unset (20 s). The endpoint stretches its linger to the
interval + 5 s; the next scrape stores the end marker; the one after finds the endpoint closed; then
the short-profile rules (for_missing 3 s) have several evaluations to page TraceMLTelemetryMissing.
Prints what happened and exits non-zero if the end paged or was not seen.

    python benchmarks/stack_end_60s.py
"""

from __future__ import annotations

import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.test_stack_lifecycle_live import _rank, _start
from tests.ports import free_port_pair
from traceml_otel.stack import StackConfig, Windows, render_all, write_files


def _until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except OSError:
            pass
        time.sleep(1)
    return False


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="stack-end-60s-"))
    write_files(render_all(StackConfig(windows=Windows.short(), scrape_interval="60s", linger_s=65)), tmp)
    port = free_port_pair()
    targets = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    server = _start(tmp, "slow", "60s", targets)
    stop = tmp / "stop"
    ranks = [_rank(tmp, "end60", "end60", r, 2, port, "--seconds", "600", "--stop-file", str(stop))
             for r in (0, 1)]
    started = time.time()
    try:
        _until(lambda: urllib.request.urlopen(f"{server.url}/-/ready", timeout=2).status == 200, 30)

        def scraped_twice() -> bool:
            counts = server.query('count_over_time(traceml_run_ended{traceml_run_id="end60"}[10m])')
            return len(counts) == 2 and all(float(c["value"][1]) >= 2 for c in counts)

        if not _until(scraped_twice, 200):
            print("the 60 s Prometheus did not scrape both ranks twice")
            return 1
        stop.write_text("")
        ended = time.time()
        for rank in ranks:
            rank.wait(timeout=150)
        closed = time.time()
        print(f"ranks ended {ended - started:.0f} s after the start; their endpoints closed "
              f"{closed - ended:.0f} s after the end (the linger, derived from the 60 s interval)")
        seen = _until(lambda: [float(r["value"][1]) for r in server.query(
            'last_over_time(traceml_run_ended{traceml_run_id="end60"}[10m])')] == [1.0, 1.0], 10)
        down = _until(lambda: all(t["health"] == "down" for t in server.api("targets")["activeTargets"]), 75)
        time.sleep(8)  # for_missing is 3 s; evaluations every second
        paged = [a for a in server.api("alerts")["alerts"]
                 if a["labels"].get("traceml_run_id") == "end60"]
        print(f"end marker stored for both ranks: {seen}; endpoints found closed: {down}; "
              f"alerts for the run after that: {[a['labels']['alertname'] for a in paged]}")
        return 0 if seen and down and not paged else 1
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
