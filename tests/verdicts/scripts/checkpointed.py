"""A model whose blocks run under torch.utils.checkpoint (``--reentrant`` or not): their forwards
are re-run inside backward, which is backward's time, not more forwards. ``--explicit`` traces with
``trace_step(model)``; without it the loop is traced zero-code."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class Model(nn.Module):
    def __init__(self, reentrant: bool, width: int = 256, blocks: int = 6) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--explicit", action="store_true")
    parser.add_argument("--reentrant", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.explicit:
        import traceml_otel as traceml

        traceml.init()
    data = TensorDataset(torch.randn(args.steps * 64, 256), torch.randn(args.steps * 64, 1))
    loader = DataLoader(data, batch_size=64)
    model = Model(args.reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for x, y in loader:
        if args.reentrant:
            x.requires_grad_(True)  # reentrant checkpointing needs an input that requires grad
        if args.explicit:
            with traceml.trace_step(model):
                step(model, optimizer, x, y)
        else:
            step(model, optimizer, x, y)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


if __name__ == "__main__":
    main()
