"""Each ``trace_step`` block fetches its own two micro-batches from a slow loader (2 ms a sample) and
accumulates their gradients: all the input wait is inside the block (``--steps`` blocks)."""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_otel as traceml


class Slow(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 64), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return self.x[index], self.y[index]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    traceml.init()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(Slow(args.steps * 16), batch_size=8))
    for _ in range(args.steps):
        with traceml.trace_step(model):
            for _ in range(2):
                x, y = next(batches)
                (nn.functional.mse_loss(model(x), y) / 2).backward()
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
