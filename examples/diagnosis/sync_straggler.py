"""A sync straggler named from measured waits: two DDP ranks (gloo, CPU), rank 1 computes more.

Rank 1 trains on batches four times as large, so rank 0 reaches the gradient all-reduce first and
waits there for rank 1. Collective timing measures that wait on each rank: rank 0 waits long, rank 1
hardly at all, and the analyzer names rank 1. Each step also averages the loss over the ranks with
an explicit ``dist.all_reduce`` (a common logging pattern), which is timed as well.

    traceml run examples/diagnosis/sync_straggler.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import mlp, parse_args, random_batches, train
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import traceml_otel as traceml


def average_loss(loss: torch.Tensor) -> None:
    """Sum the loss over the ranks (inside the step, as logging code often does)."""
    dist.all_reduce(loss.detach())


def main() -> None:
    args = parse_args(__doc__, batch_size=1024)
    traceml.init(mode="auto")
    dist.init_process_group("gloo")  # rank and world size from the torchrun environment
    batch = args.batch_size * (4 if dist.get_rank() == 1 else 1)
    loader = DataLoader(random_batches(args.steps, batch), batch_size=None)
    model = DistributedDataParallel(mlp(hidden=256, layers=2))
    loss = train(loader, model, args.steps, extra=average_loss)
    if dist.get_rank() == 0:
        print(f"sync_straggler: {args.steps} steps, final loss {loss:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
