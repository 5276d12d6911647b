"""Training with a fast loader, and every 20 steps an unmarked validation pass (model.eval(),
torch.no_grad(), a slow validation DataLoader) between steps, not inside ``outside_step``. The model is
big enough that the training loader's fetch stays a small share of a step on a loaded machine too (with
a quarter of the compute, a loaded CI machine once read 15 % input wait: INPUT_BOUND).

``--explicit`` traces each step with ``trace_step(model)``; without it the loop is traced zero-code.
``--careless``: the validation pass forgets ``model.eval()`` and ``torch.no_grad()`` (gradients on,
the model in training mode): only its second DataLoader tells it from training.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowValidation(Dataset):
    """Each sample takes 4 ms to load (a decode from disk, say)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.004)
        return torch.randn(256), torch.randn(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--explicit", action="store_true")
    parser.add_argument("--careless", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.explicit:
        import traceml_otel as traceml

        traceml.init()
    train = DataLoader(TensorDataset(torch.randn(args.steps * 32, 256), torch.randn(args.steps * 32, 1)),
                       batch_size=32)
    validation = DataLoader(SlowValidation(), batch_size=8)
    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                          nn.Linear(2048, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i, (x, y) in enumerate(train):
        if args.explicit:
            with traceml.trace_step(model):
                step(model, optimizer, x, y)
        else:
            step(model, optimizer, x, y)
        if i % 20 == 19:
            if args.careless:
                validate_carelessly(model, validation)
            else:
                validate(model, validation)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += float(nn.functional.mse_loss(model(x), y))
    model.train()
    return total


def validate_carelessly(model: nn.Module, loader: DataLoader) -> float:
    """The same pass without ``eval()`` or ``no_grad``: each forward builds a graph nobody uses."""
    total = 0.0
    for x, y in loader:
        total += float(nn.functional.mse_loss(model(x), y))
    return total


if __name__ == "__main__":
    main()
