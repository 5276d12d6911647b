"""A GAN on CPU: per step, G's forward once and D's forward three times (real, fake, generator loss).

``--explicit`` traces each iteration with ``trace_step(G)`` (the generator, as most users pass);
without it the loop is traced zero-code (two optimizers: a step ends once both have stepped).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH = 384
"""Wide enough that the loop's own Python (losses, labels, noise) stays a few % of a step under load."""


def mlp(width: int, depth: int, out: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(WIDTH, 2, WIDTH)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(z))


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(WIDTH, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--explicit", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.explicit:
        import traceml_otel as traceml

        traceml.init()
    real_data = TensorDataset(torch.randn(args.steps * 128, WIDTH))
    loader = DataLoader(real_data, batch_size=128)
    G, D = Generator(), Discriminator()
    opt_g = torch.optim.SGD(G.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(D.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    for (real,) in loader:
        if args.explicit:
            with traceml.trace_step(G):
                iteration(G, D, opt_g, opt_d, bce, real)
        else:
            iteration(G, D, opt_g, opt_d, bce, real)


def iteration(G: nn.Module, D: nn.Module, opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer,
              bce: nn.Module, real: torch.Tensor) -> None:
    ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
    fake = G(torch.randn(real.shape[0], WIDTH))
    loss_d = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    loss_g = bce(D(fake), ones)
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()


if __name__ == "__main__":
    main()
