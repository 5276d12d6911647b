"""A plain training loop with step telemetry (CPU, synthetic data, a few seconds).

    traceml run examples/quickstart.py
    python examples/quickstart.py --steps 200      # direct launch works too
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_otel as traceml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    traceml.init(mode="auto")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = args.steps * args.batch_size
    data = TensorDataset(torch.randn(n, 128), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    for x, y in loader:
        with traceml.trace_step(model):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
