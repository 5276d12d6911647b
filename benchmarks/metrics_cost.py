"""CPU the emitter spends per step on metrics: OTLP instruments, the direct scrape endpoint, both.

    .venv/bin/python benchmarks/metrics_cost.py [--only scrape] [--ddp] [--repeat 3]
    .venv/bin/python benchmarks/metrics_cost.py --scrape-alone [--ddp]

Records 20,000 synthetic steps (three phases, an input wait, CUDA peaks; with ``--ddp`` also a
sample and token count and two DDP all-reduce buckets) into the real
``StepMetrics`` in this process, in batches of 64 as the emitter hands them over
(``record_batch``), and reports process CPU time per step. This runs in the emitter process, off
the training thread; the training thread's cost is in hot_path.py. The OTLP line is the update
only (the export is in ``emitter_cost.py --otlp``). ``--scrape-alone`` calls the scrape path's
``PrometheusStepMetrics`` directly with one step's values 50,000 times (no ``StepMetrics`` around it).
"""

from __future__ import annotations

import argparse
import socket
import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from traceml_otel.emit.spans import RankInfo, StepSpanBuilder
from traceml_otel.emit.step_metrics import (
    CollectiveSample,
    LiveState,
    PrometheusEndpoint,
    PrometheusStepMetrics,
    RankLabels,
    StepMetrics,
)
from traceml_otel.step_records import CollectiveTiming, PhaseTiming, StepRecord

STEPS = 20_000
BATCH = 64
MS = 1_000_000
LABELS = RankLabels(run_id="bench", rank=0, local_rank=0, host="h", version="0")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _steps(ddp: bool) -> list:
    builder = StepSpanBuilder(
        RankInfo(run_id="bench", rank=0, local_rank=0, world_size=1, node_rank=0, host="h")
    )
    out = []
    for n in range(STEPS):
        start = n * MS
        phases = (
            PhaseTiming("forward", 0, start + 50_000, start + 350_000),
            PhaseTiming("backward", 0, start + 350_000, start + 850_000),
            PhaseTiming("optimizer", 0, start + 860_000, start + 950_000),
        )
        record = StepRecord(
            step=n,
            start_ns=start,
            end_ns=start + 990_000,
            phases=phases,
            input_wait_ns=40_000,
            input_fetches=1,
            peak_allocated_bytes=1 << 30,
            peak_reserved_bytes=2 << 30,
        )
        if ddp:
            record.samples, record.tokens = 32, 32 * 512
            record.collectives = tuple(
                CollectiveTiming("all_reduce", "ddp", start + at, start + at + 80_000, 25 << 20, False)
                for at in (500_000, 700_000))
        out.append((record, builder.build(record)))
    return out


def cost(otlp: bool, scrape: bool, ddp: bool = False) -> float:
    steps = _steps(ddp)
    metrics = StepMetrics(
        Resource.create({}),
        LABELS,
        None,
        PrometheusEndpoint(_free_port()) if scrape else None,
        metric_reader=InMemoryMetricReader() if otlp else None,
    )
    started = time.process_time()
    for first in range(0, STEPS, BATCH):
        metrics.record_batch((record, spans, True) for record, spans in steps[first:first + BATCH])
    per_step = (time.process_time() - started) / STEPS * 1e6
    metrics.shutdown(1.0)
    metrics.linger(0)
    return per_step


def scrape_alone(ddp: bool, steps: int = 50_000) -> float:
    """CPU per step of ``PrometheusStepMetrics`` alone, fed one step's values ``steps`` times."""
    metrics = PrometheusStepMetrics(None, LiveState(LABELS, lambda: 0))
    phases = [("forward", 0.0003), ("backward", 0.0005), ("optimizer", 0.00009)]
    buckets = [CollectiveSample("ddp", "all_reduce", 0.00016, 0.00002, 2, 50 << 20)]  # one per (source, kind)
    ids: tuple[object, object] = (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    if "str" in str(PrometheusStepMetrics.record.__annotations__.get("exemplar_ids")):
        ids = (f"{ids[0]:032x}", f"{ids[1]:016x}")  # trees before the hand aggregation took them in hex
    started = time.process_time()
    for _ in range(steps):
        metrics.record(0.00099, phases, 0.00004, (1 << 30, 2 << 30), ids)
        if ddp:
            metrics.record_work(32, 32 * 512)
            metrics.record_collectives(buckets)
    return (time.process_time() - started) / steps * 1e6


PATHS = {"otlp": ("OTLP instruments", True, False), "scrape": ("direct scrape endpoint", False, True),
         "both": ("both", True, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(PATHS), help="measure one path (default: all three)")
    parser.add_argument("--ddp", action="store_true", help="steps with samples, tokens and two DDP buckets")
    parser.add_argument("--repeat", type=int, default=1, help="runs per path, printed one after the other")
    parser.add_argument("--scrape-alone", action="store_true",
                        help="only PrometheusStepMetrics, called directly (no StepMetrics)")
    args = parser.parse_args()
    if args.scrape_alone:
        runs = "  ".join(f"{scrape_alone(args.ddp):6.1f}" for _ in range(args.repeat))
        print(f"{'PrometheusStepMetrics:':24} {runs} us CPU per step")
        return
    for name in [args.only] if args.only else list(PATHS):
        title, otlp, scrape = PATHS[name]
        runs = "  ".join(f"{cost(otlp, scrape, args.ddp):6.1f}" for _ in range(args.repeat))
        print(f"{title + ':':24} {runs} us CPU per step")


if __name__ == "__main__":
    main()
