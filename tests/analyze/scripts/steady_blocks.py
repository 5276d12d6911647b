"""A steady training loop run as back-to-back blocks: each block builds a fresh model, optimizer
and DataLoader (so each has its own warm-up) and trains ``--steps`` steps. The drift scenario
test analyses each block as one short run. A step takes about 1-2 ms (a block a few hundred ms), so
a burst of the machine's other work lasting tens of ms touches a few steps of a block, not a third
of it, as it did with 0.3 ms steps."""

import argparse
import glob
import os
import time

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, default=10)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

traceml.init(mode="auto")
torch.set_num_threads(1)
# The emitter process starts beside this one (about a second of imports: the OTel SDK) and would take
# the other core from the first blocks: wait until it has opened its outputs (its export statistics).
deadline = time.monotonic() + 30
while not glob.glob(os.path.join(os.environ["TRACEML_RUNS_DIR"], "*", "rank-0.export.json")):
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
for block in range(args.blocks):
    torch.manual_seed(block)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 64, 256), torch.randn(args.steps * 64, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=64):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
