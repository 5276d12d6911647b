"""A 2-rank gloo DDP job with planted slow steps, for the span budget test.

Run under `traceml run --nproc-per-node 2`. Rank 0 sleeps 0.15 s inside the steps named by
``--slow``; rank 1 waits for it in DDP's all-reduce, so those steps are slow on both ranks.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--slow", type=str, default="")
args = parser.parse_args()
slow = {int(s) for s in args.slow.split(",") if s}

traceml.init()
dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
rank = dist.get_rank()
for step in range(args.steps):
    with traceml.trace_step(model):
        if step in slow and rank == 0:
            time.sleep(0.15)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
print(f"rank {rank} trained {args.steps} steps", flush=True)
dist.destroy_process_group()
