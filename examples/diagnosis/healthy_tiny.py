"""A healthy small run (a few milliseconds per step): it must come out COMPUTE_BOUND or BALANCED.

The model computes its own loss in ``forward`` (as Hugging Face models do), so only
``zero_grad`` runs inside the step outside the phases. Whatever else the analyzer finds outside
them is tracing overhead, and short steps are where that overhead would show: this scenario
must not come out RESIDUAL_HEAVY or INPUT_BOUND.

    traceml run examples/diagnosis/healthy_tiny.py -- --steps 200
"""

from __future__ import annotations

import torch
from _common import mlp, parse_args, random_batches, train
from torch import nn
from torch.utils.data import DataLoader

import traceml_otel as traceml


class ClassifierWithLoss(nn.Module):
    """An MLP whose forward returns the loss when given the labels."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = mlp(hidden=hidden, layers=3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(self.body(x), labels)


def main() -> None:
    args = parse_args(__doc__, steps=200, batch_size=64)
    traceml.init(mode="auto")
    model = ClassifierWithLoss(hidden=512)
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    loss = train(loader, model, args.steps, compute_loss=model)
    print(f"healthy_tiny: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
