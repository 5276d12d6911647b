"""INPUT_BOUND: the dataset is slow (decoding simulated by a sleep per sample), the model is fast.

traceml run examples/diagnosis/input_bound.py -- --steps 40
"""

from __future__ import annotations

import time

import torch
from _common import CLASSES, IN_FEATURES, mlp, parse_args, train
from torch.utils.data import DataLoader, Dataset

import traceml_otel as traceml


class SlowDataset(Dataset):
    """Every sample costs ``delay`` seconds, as if read and decoded from slow storage."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay)
        return torch.randn(IN_FEATURES), index % CLASSES


def main() -> None:
    args = parse_args(__doc__, batch_size=16)
    traceml.init(mode="auto")
    loader = DataLoader(SlowDataset(args.steps * args.batch_size, delay=0.001), batch_size=args.batch_size)
    loss = train(loader, mlp(), args.steps)
    print(f"input_bound: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
