"""CPU the emitter process spends per step: the cost that competes with training for the machine.

    .venv/bin/python benchmarks/emitter_cost.py

Feeds 2,000 synthetic 1 ms steps (step + forward + backward + optimizer spans) through the real
``Emitter`` in this process and reports process CPU time per step: local copy only, then local
copy plus OTLP gRPC export to a real rotel collector (blackhole exporter). CPU time, unlike wall
time, is stable on these noisy VMs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import _start_rotel

from traceml_otel.emit.worker import Emitter

STEPS = 2000
MS = 1_000_000


def _rows(first: int, count: int) -> list[list]:
    rows = []
    for step in range(first, first + count):
        start = step * MS
        phases = [["forward", 0, start + 50_000, start + 350_000, None, None, None],
                  ["backward", 0, start + 350_000, start + 850_000, None, None, None],
                  ["optimizer", 0, start + 860_000, start + 950_000, None, None, None]]
        rows.append([step, start, start + 990_000, None, 40_000, None, 1, None, 1, "none",
                     None, None, None, None, phases])
    return rows


def cost(traces: list[str] | None) -> float:
    if traces:  # the SDK exporters read their endpoint from the environment, as in a real emitter
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = traces[0]
    with tempfile.TemporaryDirectory() as run_dir:
        hello = {"run_id": "bench", "rank": 0, "local_rank": 0, "world_size": 1, "node_rank": 0,
                 "host": "h", "pid": 1, "anchor_ns": time.time_ns(), "service_name": "bench",
                 "run_dir": run_dir, "traces": traces, "metrics": None, "sampler": "always_on"}
        emitter = Emitter(hello)
        started = time.process_time()
        for first in range(0, STEPS, 64):
            emitter.handle_steps(_rows(first, min(64, STEPS - first)))
        emitter.finish("ok", 0, True)
        per_step = (time.process_time() - started) / STEPS * 1e6
        assert emitter.stats.spans_local == STEPS * 4
        if traces:
            assert emitter.stats.otlp_exported == STEPS * 4, emitter.stats
        return per_step


def main() -> None:
    print(f"local copy only:        {cost(None):7.1f} us CPU per step (4 spans)")
    rotel, endpoint = _start_rotel()
    try:
        print(f"local copy + OTLP gRPC: {cost([endpoint, 'grpc']):7.1f} us CPU per step (4 spans)")
    finally:
        rotel.kill()


if __name__ == "__main__":
    main()
