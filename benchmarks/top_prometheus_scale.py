"""``traceml top --prometheus`` against ``stack_scale.py``'s simulation: refresh time, samples, lines.

N simulated ranks serve the emitter's real exposition (``benchmarks/stack_scale.py``: its worker
processes, its rendered rules, a real Prometheus scraping and evaluating every 1 s), and after a
warm-up this script refreshes the fleet view of the simulated run several times, as ``traceml top
--prometheus URL --run-id sim-run`` does, and prints a Markdown table: per world size, the wall time
of a refresh (median and worst), the samples its queries read (``stats=all``, the sum over its
queries), the queries, and the lines on screen. Budget: at most 2 M samples and 1 s per refresh.

    PYTHONPATH=$PWD python benchmarks/top_prometheus_scale.py --ranks 1024 --seconds 60
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stack_scale

from tests.ports import free_port
from tests.prometheus_server import start_prometheus, static_targets
from traceml_otel.cli.top_prometheus import PrometheusTop, render
from traceml_otel.stack import StackConfig, Windows, render_all, write_files

BUDGET_SAMPLES = 2_000_000
BUDGET_S = 1.0


def measure(ranks: int, seconds: float, workers: int, refreshes: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="top-scale-"))
    write_files(render_all(StackConfig(windows=Windows.short())), tmp)
    ports = [free_port() for _ in range(workers)]
    context = multiprocessing.get_context("spawn")
    procs = []
    per = -(-ranks // workers)
    for index, port in enumerate(ports):
        ready = context.Event()
        hosted = range(index * per, min(ranks, (index + 1) * per))
        proc = context.Process(target=stack_scale._serve, args=(hosted, ranks, port, index, ready),
                               daemon=True)
        proc.start()
        ready.wait(120)
        procs.append(proc)
    server = start_prometheus(tmp / "server", [static_targets("traceml", [f"127.0.0.1:{p}" for p in ports])],
                              rules_dir=tmp / "prometheus", flags=["--query.max-samples=200000000"],
                              port=free_port(avoid=tuple(ports)))
    try:
        time.sleep(seconds)
        top = PrometheusTop(server.url, run_id=stack_scale.RUN_ID, timeout=60)
        walls, samples, lines = [], [], 0
        for _ in range(refreshes):
            began = time.monotonic()
            view = top.refresh(stack_scale.RUN_ID)
            screen = render(view)
            walls.append(time.monotonic() - began)
            samples.append(view.samples)
            lines = len(screen)
            time.sleep(1.0)
        print("\n".join(screen), file=sys.stderr)
        print("last refresh, per query (s): " + ", ".join(f"{k} {v:.2f}" for k, v in view.query_s.items()),
              file=sys.stderr)
        return {"ranks": ranks, "wall_median": statistics.median(walls), "wall_max": max(walls),
                "samples": max(samples), "queries": view.queries, "lines": lines,
                "ranks_seen": len(view.per_rank.get("steps", {}))}
    finally:
        server.stop()
        for proc in procs:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, action="append", help="simulated ranks (repeatable)")
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated run before measuring")
    parser.add_argument("--refreshes", type=int, default=5)
    parser.add_argument("--workers", type=int, default=max(1, min(4, (os.cpu_count() or 2))))
    args = parser.parse_args()
    rows = [measure(n, args.seconds, args.workers, args.refreshes) for n in (args.ranks or [1024])]
    print("| ranks | ranks seen | queries | samples per refresh | refresh s (median) | refresh s (worst) "
          "| lines on screen | within budget |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        inside = r["samples"] <= BUDGET_SAMPLES and r["wall_max"] <= BUDGET_S
        print(f"| {r['ranks']} | {r['ranks_seen']} | {r['queries']} | {r['samples']:,} "
              f"| {r['wall_median']:.2f} | {r['wall_max']:.2f} | {r['lines']} "
              f"| {'yes' if inside else '**no**'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
