"""COMPUTE_BOUND: batches are ready in memory and the model is big enough to dominate the step.

traceml run examples/diagnosis/compute_bound.py -- --steps 40
"""

from __future__ import annotations

from _common import mlp, parse_args, random_batches, train
from torch.utils.data import DataLoader

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__, batch_size=128)
    traceml.init(mode="auto")
    # batch_size=None: the dataset already yields whole batches, so fetching one is nearly free.
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    loss = train(loader, mlp(hidden=1024, layers=3), args.steps)
    print(f"compute_bound: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
