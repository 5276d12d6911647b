"""INPUT_STRAGGLER: two DDP ranks (gloo, CPU), and rank 1's data loading is slower.

Rank 0 then waits for rank 1 inside backward (the gradient all-reduce), which is how the
analyzer finds the culprit.

    traceml run examples/diagnosis/input_straggler.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from _common import CLASSES, IN_FEATURES, mlp, parse_args, train
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import traceml_otel as traceml


class ShardDataset(Dataset):
    """This rank's shard; ``delay`` seconds per sample (rank 1 reads from 'slower storage')."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.delay:
            time.sleep(self.delay)
        return torch.randn(IN_FEATURES), index % CLASSES


def main() -> None:
    args = parse_args(__doc__, batch_size=16)
    traceml.init(mode="auto")
    dist.init_process_group("gloo")  # rank and world size from the torchrun environment
    delay = 0.0008 if dist.get_rank() == 1 else 0.0
    loader = DataLoader(ShardDataset(args.steps * args.batch_size, delay), batch_size=args.batch_size)
    model = DistributedDataParallel(mlp())
    loss = train(loader, model, args.steps)
    if dist.get_rank() == 0:
        print(f"input_straggler: {args.steps} steps, final loss {loss:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
