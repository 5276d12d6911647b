"""A GradScaler loop (CPU) whose every 5th iteration has inf gradients: ``scaler.step`` skips that
update. ``--explicit`` traces with ``trace_step(model)``; without it the loop is traced zero-code."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--explicit", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.explicit:
        import traceml_otel as traceml

        traceml.init()
    data = TensorDataset(torch.randn(args.steps * 32, 128), torch.randn(args.steps * 32, 1))
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", growth_interval=1_000_000)
    for i, (x, y) in enumerate(DataLoader(data, batch_size=32)):
        overflow = i % 5 == 4
        if args.explicit:
            with traceml.trace_step(model):
                step(model, optimizer, scaler, x, y, overflow)
        else:
            step(model, optimizer, scaler, x, y, overflow)
    print(f"final scale {scaler.get_scale()}")


def step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, x: torch.Tensor,
         y: torch.Tensor, overflow: bool) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    if overflow:  # as an fp16 overflow would: inf gradients, so the scaler skips this update
        loss = loss * float("inf")
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


if __name__ == "__main__":
    main()
