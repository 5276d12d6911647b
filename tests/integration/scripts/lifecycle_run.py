"""One rank of a job for the live lifecycle test: steps for a while, then ends cleanly or raises.

The rank's identity comes from the environment the test sets (RANK, LOCAL_RANK, WORLD_SIZE,
TRACEML_RUN_ID, TRACEML_JOB, TRACEML_PROMETHEUS_PORT), as torchrun's would. Prints `stepping`
once the first step is done.
"""

import argparse
import os
import time

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, required=True, help="how long to step")
parser.add_argument("--step", type=float, default=0.05, help="traced seconds per step")
parser.add_argument("--raise-oom", action="store_true", help="end with torch.cuda.OutOfMemoryError")
parser.add_argument("--stop-file", default="", help="end early once this file exists")
args = parser.parse_args()

traceml.init(mode="auto")
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
start = time.monotonic()
first = True
while time.monotonic() - start < args.seconds and not (args.stop_file and os.path.exists(args.stop_file)):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
        time.sleep(args.step)
    if first:
        print("stepping", flush=True)
        first = False
if args.raise_oom:
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
print("done", flush=True)
