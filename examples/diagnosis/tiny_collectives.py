"""COMMUNICATION_BOUND in the latency regime: two ranks (gloo, CPU) making many tiny collectives.

A small model whose step also all-reduces 48 one-element metrics, one call each (a pattern seen in
hand-written logging code). Each call moves 4 bytes, yet pays a collective's fixed latency, so the
collectives take most of the step: the advice is fewer, larger collectives, not fewer bytes.

    traceml run examples/diagnosis/tiny_collectives.py --nproc-per-node 2 -- --steps 40
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import mlp, parse_args, random_batches, train
from torch.utils.data import DataLoader

import traceml_otel as traceml

METRICS = 48


def reduce_metrics(loss: torch.Tensor) -> None:
    """One all_reduce per scalar metric, as logging code written metric by metric does."""
    for _ in range(METRICS):
        dist.all_reduce(loss.detach().reshape(1))


def main() -> None:
    args = parse_args(__doc__, batch_size=8)
    traceml.init(mode="auto")
    dist.init_process_group("gloo")  # rank and world size from the torchrun environment
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    model = mlp(hidden=32, layers=1)
    loss = train(loader, model, args.steps, extra=reduce_metrics)
    if dist.get_rank() == 0:
        print(f"tiny_collectives: {args.steps} steps, {METRICS} all_reduce calls per step, loss {loss:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
