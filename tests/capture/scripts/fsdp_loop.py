"""Two FSDP2 ranks (gloo, CPU) training a small MLP for a few steps under traceml."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import traceml_otel as traceml

torch.set_num_threads(1)
traceml.init()
dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(4):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        optimizer.step()
traceml.shutdown()
dist.destroy_process_group()
