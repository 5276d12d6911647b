"""RESIDUAL_HEAVY: every step also does work outside forward, backward and the optimizer.

Here that is per-step "logging": a host sync to read the loss, a gradient-norm sweep over the
parameters, and a blocking write (simulated by a sleep), all inside ``trace_step``.

    traceml run examples/diagnosis/residual_heavy.py -- --steps 40
"""

from __future__ import annotations

import time

import torch
from _common import mlp, parse_args, random_batches, train
from torch.utils.data import DataLoader

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__)
    traceml.init(mode="auto")
    model = mlp()
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    history: list[tuple[float, float]] = []

    def log_every_step(loss: torch.Tensor) -> None:
        grad_norm = sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)
        history.append((loss.item(), grad_norm))
        time.sleep(0.006)  # a synchronous write to a slow metrics sink

    loss = train(loader, model, args.steps, extra=log_every_step)
    print(f"residual_heavy: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
