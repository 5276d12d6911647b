"""Two Accelerate processes (CPU, gloo DDP) whose optimizer step is the largest part of the step.

Gradients of ~0.5 MiB are all-reduced every step (a real share of the step), but the optimizer
(an SGD that also sleeps, as a slow host-side update rule would) takes more. ``--explicit`` wraps each
step in ``trace_step``; without it the loop is traced zero-code.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SlowSGD(torch.optim.SGD):
    """SGD plus a fixed host-side cost per update."""

    def step(self, closure=None):  # type: ignore[override]
        time.sleep(0.04)
        return super().step(closure)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--explicit", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.explicit:
        import traceml_otel as traceml

        traceml.init()
    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.randn(args.steps * 8, 256), torch.randn(args.steps * 8, 256))
    loader = DataLoader(data, batch_size=8)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    optimizer = SlowSGD(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        if args.explicit:
            with traceml.trace_step(accelerator.unwrap_model(model)):
                train_step(accelerator, model, optimizer, x, y)
        else:
            train_step(accelerator, model, optimizer, x, y)


def train_step(accelerator: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


if __name__ == "__main__":
    main()
