"""A steady training loop run as back-to-back blocks: each block builds a fresh model, optimizer
and DataLoader (so each has its own warm-up) and trains ``--steps`` steps. The drift scenario
test analyses each block as one short run."""

import argparse

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, default=10)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

traceml.init(mode="auto")
torch.set_num_threads(1)
for block in range(args.blocks):
    torch.manual_seed(block)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 32), torch.randn(args.steps * 16, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=16):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
