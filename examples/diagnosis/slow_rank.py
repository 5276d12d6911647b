"""One slow rank of two: a straggler under DDP, INDEPENDENT_RANKS without a gradient sync.

Rank 1 computes slower (its forward takes ~10 ms more). Under DDP (``--ddp``, gloo) rank 0 waits
for it in the gradient all-reduce: the analyzer attributes that waiting to rank 1 and names it a
straggler. The model is small (36 KiB of gradients), so the all-reduce itself costs little and the
waiting is what the step loses. (With 400 KiB of gradients, the transfer alone took ~8 ms per step
on a loaded 2-core machine, as much as the delay: then the run is communication-bound as well, and
which finding comes first was a coin toss.) Without a process group the two processes train
separately: nobody waits, so there is no straggler to name; the analyzer compares the ranks
instead (INDEPENDENT_RANKS, rank 1 slower).

    traceml run examples/diagnosis/slow_rank.py --nproc-per-node 2 -- --steps 40 --ddp
    traceml run examples/diagnosis/slow_rank.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from _common import mlp, parse_args, random_batches, train
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import traceml_otel as traceml

DELAY_S = float(os.environ.get("SLOW_RANK_DELAY_MS", "10")) / 1000
"""Rank 1's extra forward time (``SLOW_RANK_DELAY_MS``, default 10)."""
BASE_S = float(os.environ.get("SLOW_RANK_BASE_MS", "0")) / 1000
"""Forward time every rank sleeps (``SLOW_RANK_BASE_MS``, default 0): with a delay of 0, a balanced,
compute-heavy DDP job (benchmarks/communication_alerts_live.py's healthy case)."""


class Slow(torch.autograd.Function):
    """Identity whose forward sleeps ``DELAY_S`` (stands for a slower device)."""

    @staticmethod
    def forward(ctx, x, seconds: float):  # type: ignore[override]
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class Model(nn.Module):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.body = mlp(hidden=64, layers=1)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seconds = BASE_S + (DELAY_S if self.slow else 0.0)
        return self.body(Slow.apply(x, seconds) if seconds > 0 else x)


def main() -> None:
    ddp = "--ddp" in sys.argv
    if ddp:
        sys.argv.remove("--ddp")
    args = parse_args(__doc__)
    traceml.init(mode="auto")
    rank = int(os.environ.get("RANK", "0"))
    model: nn.Module = Model(slow=rank == 1)
    if ddp:
        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
    batches = random_batches(args.steps, args.batch_size)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    loss = train(loader, model, args.steps)
    if rank == 0:
        print(f"slow_rank ({'ddp' if ddp else 'independent'}): {args.steps} steps, final loss {loss:.3f}")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
