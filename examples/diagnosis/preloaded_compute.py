"""COMPUTE_BOUND without a DataLoader: batches sliced from tensors already in memory (``x = X[i]``).

No fetch is timed, so input wait is unknown; the analyzer judges compute, communication and residual
on the traced step time, and the time between steps (recorded on every step) is tiny.

    traceml run examples/diagnosis/preloaded_compute.py -- --steps 40
"""

from __future__ import annotations

import torch
from _common import CLASSES, IN_FEATURES, mlp, parse_args, train

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__, batch_size=128)
    traceml.init(mode="auto")
    inputs = torch.randn(args.steps * args.batch_size, IN_FEATURES)
    labels = torch.randint(0, CLASSES, (args.steps * args.batch_size,))
    size = args.batch_size
    # slices of pre-loaded tensors: no DataLoader, nothing to fetch
    batches = ((inputs[i * size:(i + 1) * size], labels[i * size:(i + 1) * size]) for i in range(args.steps))
    loss = train(batches, mlp(hidden=1024, layers=3), args.steps)
    print(f"preloaded_compute: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
