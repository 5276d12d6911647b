"""Training loops for the deep-capture tests: one planted problem each (``--loop``).

- ``svd``: every ``--every``-th step runs a large ``torch.linalg.svd`` nothing else uses.
- ``item``: every step computes a metric in plain tensor code and reads it with ``.item()`` (residual);
  from step ``--start`` on (default 0: from the first step; later: a residual jump); ``--item-work``
  rounds of metric code per step (default 8).
- ``spike``: every ``--every``-th step sleeps in extra matrix products (a spike).
- ``user_profiler``: the ``svd`` loop run inside the user's own ``torch.profiler``.
- ``slow``: plain steps (for ``traceml capture`` on demand); ``--sleep`` seconds between steps.
- ``straggler``: two ranks (gloo) that all-reduce every step; rank 1 does extra work from half-way.
"""

from __future__ import annotations

import argparse
import time

import torch

import traceml_otel as traceml


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", default="svd")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=40)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--item-work", type=int, default=8)
    args = parser.parse_args()
    traceml.init()
    if args.loop == "straggler":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width = args.width
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, width), torch.randint(0, 8, (32,))
    big = torch.randn(384, 384)
    if args.loop == "user_profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            loop(args, model, optimizer, x, y, big)
    else:
        loop(args, model, optimizer, x, y, big)
    if args.loop == "straggler":
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    traceml.shutdown()


def loop(args, model, optimizer, x, y, big) -> None:
    mode = "svd" if args.loop == "user_profiler" else args.loop
    for step in range(args.steps):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if mode == "svd" and step % args.every == args.every - 1:
                torch.linalg.svd(big)
            elif mode == "spike" and step % args.every == args.every - 1:
                for _ in range(30):
                    big @ big
            elif mode == "straggler":
                import torch.distributed as dist

                if dist.get_rank() == 1 and step >= args.steps // 2:
                    for _ in range(20):
                        big @ big
                total = loss.detach().clone()
                dist.all_reduce(total)
            elif mode == "item" and step >= args.start:
                scores = (big[:64] @ big[:, :64]).softmax(-1)
                for _ in range(args.item_work):
                    scores = (scores @ scores.T).softmax(-1)
                accuracy = (scores.argmax(1) == 0).float().mean().item()
                assert accuracy >= 0
        if args.sleep:
            time.sleep(args.sleep)


if __name__ == "__main__":
    main()
