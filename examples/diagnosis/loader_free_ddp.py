"""COMMUNICATION_BOUND without a DataLoader: two DDP ranks (gloo, CPU) on pre-loaded tensors.

The wide MLP of communication_bound.py on tiny batches sliced from tensors in memory: no fetch is
timed, and the analyzer still judges the traced time, where the exposed gradient all-reduce dominates.

    traceml run examples/diagnosis/loader_free_ddp.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import CLASSES, IN_FEATURES, mlp, parse_args, train
from torch.nn.parallel import DistributedDataParallel

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__, batch_size=2)
    traceml.init(mode="auto")
    dist.init_process_group("gloo")  # rank and world size from the torchrun environment
    inputs = torch.randn(args.steps, args.batch_size, IN_FEATURES)
    labels = torch.randint(0, CLASSES, (args.steps, args.batch_size))
    model = DistributedDataParallel(mlp(hidden=3072, layers=2))
    loss = train(((inputs[i], labels[i]) for i in range(args.steps)), model, args.steps)
    if dist.get_rank() == 0:
        print(f"loader_free_ddp: {args.steps} steps, loss {loss:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
