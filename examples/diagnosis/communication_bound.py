"""COMMUNICATION_BOUND: two DDP ranks (gloo, CPU) whose gradients are large against their compute.

A wide MLP on tiny batches: each step computes little, then all-reduces about 38 MiB of gradients,
and backward waits for most of that transfer after its last gradient is ready.

    traceml run examples/diagnosis/communication_bound.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import torch.distributed as dist
from _common import mlp, parse_args, random_batches, train
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__, batch_size=2)
    traceml.init(mode="auto")
    dist.init_process_group("gloo")  # rank and world size from the torchrun environment
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    model = DistributedDataParallel(mlp(hidden=3072, layers=2))
    loss = train(loader, model, args.steps)
    if dist.get_rank() == 0:
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"communication_bound: {args.steps} steps, {gradient_bytes} gradient bytes, loss {loss:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
