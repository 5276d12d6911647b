"""FSDP2 (``fully_shard``) over gloo on CPU with step telemetry (test script for test_fsdp2.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import traceml_otel as traceml


def main() -> None:
    traceml.init()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    fully_shard(model[0])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    n = 32 * 12
    data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    for x, y in torch.utils.data.DataLoader(data, batch_size=32):
        with traceml.trace_step(model):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
