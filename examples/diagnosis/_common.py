"""Shared pieces of the diagnosis scenarios: arguments, a small MLP and the traced training loop.

Each scenario changes one thing (a slow dataset, extra work in the step, a bypassed hook, ...)
and otherwise trains the same way, so the diagnosis it earns comes from that one thing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

import torch
from torch import nn

import traceml_otel as traceml

IN_FEATURES, CLASSES = 128, 10


def parse_args(description: str | None, steps: int = 60, batch_size: int = 64) -> argparse.Namespace:
    """``--steps`` and ``--batch-size``; sets torch to one thread (the scenarios run side by side)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="training steps to run")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return args


def mlp(hidden: int = 256, layers: int = 2) -> nn.Module:
    """A plain MLP classifier: ``layers`` hidden layers of width ``hidden``."""
    blocks: list[nn.Module] = []
    width = IN_FEATURES
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, CLASSES))


def random_batches(count: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ready-made batches, so a loader over them costs next to nothing."""
    return [
        (torch.randn(batch_size, IN_FEATURES), torch.randint(0, CLASSES, (batch_size,))) for _ in range(count)
    ]


def train(
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    model: nn.Module,
    steps: int,
    *,
    compute_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    extra: Callable[[torch.Tensor], None] | None = None,
) -> float:
    """Train for ``steps`` steps inside ``trace_step``; returns the last loss.

    ``compute_loss(x, y)`` replaces ``cross_entropy(model(x), y)``; ``extra(loss)`` runs inside the
    step after the optimizer.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    compute_loss = compute_loss or (lambda x, y: loss_fn(model(x), y))
    loss = torch.zeros(())
    for step, (x, y) in enumerate(loader):
        if step >= steps:
            break
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = compute_loss(x, y)
            loss.backward()
            optimizer.step()
            if extra is not None:
                extra(loss)
    return float(loss.detach())
