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
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.step_row import PhaseRow, StepRow

STEPS = 2000
MS = 1_000_000


def _rows(first: int, count: int) -> list[StepRow]:
    rows = []
    for step in range(first, first + count):
        start = step * MS
        phases = [PhaseRow.timed("forward", 0, start + 50_000, start + 350_000, None),
                  PhaseRow.timed("backward", 0, start + 350_000, start + 850_000, None),
                  PhaseRow.timed("optimizer", 0, start + 860_000, start + 950_000, None)]
        rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + 990_000,
                             input_wait_ns=40_000, input_fetches=1, optimizer_steps=1,
                             phases=phases))
    return rows


def cost(traces: list[str] | None) -> float:
    if traces:  # the SDK exporters read their endpoint from the environment, as in a real emitter
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = traces[0]
    with tempfile.TemporaryDirectory() as run_dir:
        endpoint, protocol = traces if traces else (None, None)
        hello = Hello(run_id="bench", rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                      anchor_ns=time.time_ns(), shutdown_timeout_s=10.0, service_name="bench",
                      run_dir=run_dir, traces_endpoint=endpoint, traces_protocol=protocol,
                      sampler="always_on")
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
