"""BETWEEN_STEPS: a plain loop (no traceml line at all) whose batches come from a slow generator.

The generator stands for a streaming reader or on-the-fly tokenisation: 15 ms per batch, against a
few milliseconds of compute. Under ``traceml run`` the steps are inferred (one per optimizer update)
and the time between them, where the generator runs, is reported as its own finding: no fetch was
measured, so it is not called input wait. With ``--wrap`` the script wraps the generator in
``traceml.wrap_dataloader_fetch`` and its steps in ``trace_step``: the fetches are then measured and
the verdict is INPUT_BOUND.

    traceml run examples/diagnosis/slow_generator.py -- --steps 30
    traceml run examples/diagnosis/slow_generator.py -- --steps 30 --wrap
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch
from torch import nn


def batches(count: int, batch_size: int):
    """What a streaming reader does: build each batch on demand, slowly."""
    for _ in range(count):
        time.sleep(0.015)
        yield torch.randn(batch_size, 128), torch.randint(0, 10, (batch_size,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--wrap", action="store_true", help="measure the fetches with traceml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    source = batches(args.steps, args.batch_size)
    step: contextlib.AbstractContextManager = contextlib.nullcontext()
    if args.wrap:
        import traceml_otel as traceml

        traceml.init(mode="auto")
        source = traceml.wrap_dataloader_fetch(source)
    for x, y in source:
        if args.wrap:
            step = traceml.trace_step(model)
        with step:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    print(f"slow_generator: {args.steps} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
