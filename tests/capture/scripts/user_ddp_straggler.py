"""A user's 2-process DDP training script (gloo, CPU) whose rank 1 turns slow half-way (extra data
preparation on that rank only): ``traceml run --nproc-per-node=2 user_ddp_straggler.py``."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import traceml_otel as traceml

traceml.init()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                                    torch.nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
noise = torch.randn(384, 384)
for step in range(240):
    with traceml.trace_step(model):
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        if rank == 1 and step >= 120:
            for _ in range(15):  # a slower augmentation on this host only
                noise = (noise @ noise).tanh()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
dist.barrier()
dist.destroy_process_group()
traceml.shutdown()
