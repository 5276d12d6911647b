"""A 2-rank gloo DDP job for the live communication test: large gradients, little compute, for a set time.

Run under `traceml run --nproc-per-node 2`. Each step all-reduces about 38 MiB of gradients after
computing on a batch of 2, so the step waits for most of the transfer (communication-bound, as
examples/diagnosis/communication_bound.py). Both ranks stop at the same step (rank 0 decides).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, required=True)
args = parser.parse_args()

traceml.init(mode="auto")
dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(128, 3072), nn.ReLU(), nn.Linear(3072, 3072), nn.ReLU(), nn.Linear(3072, 10))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [(torch.randn(2, 128), torch.randint(0, 10, (2,))) for _ in range(16)]
loader = torch.utils.data.DataLoader(batches * 100_000, batch_size=None)
deadline = time.monotonic() + args.seconds
stop = torch.zeros(1)
for step, (x, y) in enumerate(loader):
    if step % 10 == 0:  # agree on the end, outside the traced step
        stop.fill_(float(time.monotonic() > deadline))
        dist.broadcast(stop, src=0)
        if stop.item():
            break
    with traceml.trace_step(model):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
if dist.get_rank() == 0:
    print(f"done {step} steps", flush=True)
dist.destroy_process_group()
