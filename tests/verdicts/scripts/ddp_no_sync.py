"""DDP (2 ranks, gloo) accumulating 4 micro-batches per update under ``no_sync``, with every
micro-batch's fetch inside the explicit ``trace_step`` block (the loop holds an iterator).
``--zero-code``: the same loop without ``trace_step`` (steps inferred: the update's first fetch is
before its step, the other three inside it)."""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

ACCUMULATION = 4


class Slow(Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        return torch.randn(64), torch.randn(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=24)
    parser.add_argument("--zero-code", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.zero_code:
        import traceml_otel as traceml

        traceml.init()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(Slow(), batch_size=8))
    for _ in range(args.updates):
        with contextlib.nullcontext() if args.zero_code else traceml.trace_step(model):
            for micro in range(ACCUMULATION):
                x, y = next(batches)
                sync = micro == ACCUMULATION - 1
                with contextlib.nullcontext() if sync else model.no_sync():
                    (nn.functional.mse_loss(model(x), y) / ACCUMULATION).backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
