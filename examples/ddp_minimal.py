"""DistributedDataParallel on CPU (gloo) with step telemetry.

    traceml run examples/ddp_minimal.py --nproc-per-node 2
    torchrun --nproc-per-node 2 examples/ddp_minimal.py   # direct launch works too
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import traceml_otel as traceml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    traceml.init(mode="auto")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    n = args.steps * args.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    for x, y in loader:
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        print(f"final loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
