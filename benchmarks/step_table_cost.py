"""CPU the step table adds to the emitter per step, beside the local copy it sits next to.

    .venv/bin/python benchmarks/step_table_cost.py [--steps 20000]

Builds synthetic DDP-like steps (step, forward, backward, optimizer, H2D and a collective span) with
the emitter's own span builder, then times, in process CPU seconds (stable on a noisy VM), writing
them in batches of 64 as the emitter does: the local copy's OTLP JSON line alone, and the step
table's rows alone. Prints microseconds per step and the table's cost as a share of the local
copy's. Both run in the emitter process, never on the training thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.synthetic_runs import START_NS, SyntheticRank, SyntheticStep
from traceml_otel import contract as c
from traceml_otel.emit.local_copy import LocalCopyWriter
from traceml_otel.emit.step_table import StepTable

BATCH = 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    rank = SyntheticRank("bench", 0, 2)
    built = []
    start = START_NS
    for number in range(args.steps):
        step = SyntheticStep(rank=0, step=number, world_size=2, parallelism="ddp", h2d=0.0004, ddp_wait=0.001)
        built.append(rank.build(step, start))
        start += 20_000_000
    batches = [built[i:i + BATCH] for i in range(0, len(built), BATCH)]
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder)
        local = LocalCopyWriter(run_dir / c.traces_file_name(0), rank.resource, rank.scope)
        began = time.process_time()
        for batch in batches:
            local.write([span for spans in batch for span in spans.all()], steps=len(batch))
        local_us = (time.process_time() - began) / args.steps * 1e6
        local.close()
        table = StepTable(run_dir, "bench", 0, print)
        began = time.process_time()
        for batch in batches:
            table.write(batch)
        table.close()
        table_us = (time.process_time() - began) / args.steps * 1e6
        spans = len(built[0].all())
        sizes = {p.name: p.stat().st_size for p in run_dir.iterdir()}
    print(f"{args.steps:,} steps of {spans} spans, batches of {BATCH}")
    print(f"local copy (OTLP JSON): {local_us:6.1f} us CPU per step, "
          f"{sizes[c.traces_file_name(0)] / args.steps:.0f} bytes per step")
    print(f"step table (CSV):       {table_us:6.1f} us CPU per step, "
          f"{sizes['rank-0.steps.csv'] / args.steps:.0f} bytes per step")
    print(f"the table adds {table_us / local_us:.0%} of the local copy's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
