"""A 2-rank gloo job for the live view's tests: steady ~50 ms steps, its own prints, its pid on disk."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import traceml_otel as traceml

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
dist.init_process_group("gloo")
traceml.init()
rank = dist.get_rank()
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
pids = os.environ.get("LIVE_PIDS_DIR")
if pids:
    with open(os.path.join(pids, f"rank{rank}.pid"), "w") as out:
        out.write(str(os.getpid()))
for i in range(steps):
    with traceml.trace_step(model):
        loss = model(torch.randn(32, 64)).sum()
        loss.backward()
        optimizer.step()
        time.sleep(delay)
    if i % 20 == 0:
        print(f"script line: rank {rank} step {i}", flush=True)
print(f"script line: rank {rank} finished", flush=True)
dist.destroy_process_group()
