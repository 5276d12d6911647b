"""A healthy run whose steps are paced as a device-bound step is: most of each forward waits (10 ms
of sleep, as the host waits on a GPU) and a small MLP computes the rest, so a CPU load that comes
and goes barely moves the step time (``--steps`` steps, one trace_step each)."""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import traceml_otel as traceml

PACE_S = 0.010


class Paced(nn.Module):
    """A small MLP whose forward also waits ``PACE_S`` (the device's share of a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(PACE_S)
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    traceml.init()
    model = Paced()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(args.steps):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
