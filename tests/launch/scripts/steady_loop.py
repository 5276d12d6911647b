"""A tiny instrumented loop for launcher tests: prints `completed N` after each step."""

import argparse
import os
import sys
import time

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--raise-at", type=int, default=-1, help="raise inside this step")
parser.add_argument("--silent-rank", type=int, default=-1, help="this rank sends no telemetry")
args, _ = parser.parse_known_args()  # tests pass extra (secret-looking) arguments too

traceml.init(mode="auto", disabled=int(os.environ.get("RANK", "0")) == args.silent_rank)
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
dataset = torch.utils.data.TensorDataset(torch.randn(args.steps * 4, 8))
loader = torch.utils.data.DataLoader(dataset, batch_size=4)
for step, (x,) in enumerate(loader):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        time.sleep(args.sleep)
        if step == args.raise_at:
            raise RuntimeError(f"user bug at step {step}")
    sys.stdout.write(f"completed {step}\n")  # one write: ranks share the pipe
    sys.stdout.flush()
sys.exit(args.exit_code)
