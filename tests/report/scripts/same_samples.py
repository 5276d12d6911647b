"""Train over the same samples with a given batch size (the compare scenario: batch 16 vs 64)."""

import argparse

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--samples", type=int, default=2048)
args = parser.parse_args()

traceml.init(mode="auto")
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
features, labels = torch.randn(args.samples, 64), torch.randint(0, 10, (args.samples,))
# Whole batches from the dataset (batch_size=None): the fetch costs the same for 16 or 64 samples, so
# the larger batch is clearly cheaper per sample, as in real training, not lost in per-item collation.
batches = [(features[i:i + args.batch_size], labels[i:i + args.batch_size])
           for i in range(0, args.samples, args.batch_size)]
for x, y in torch.utils.data.DataLoader(batches, batch_size=None):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
