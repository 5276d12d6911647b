"""The Hugging Face Accelerate flow with step telemetry (CPU works).

    traceml run examples/integrations/accelerate_minimal.py
    ACCELERATE_USE_CPU=1 traceml run examples/integrations/accelerate_minimal.py --nproc-per-node 2
    accelerate launch --cpu --num_processes 2 examples/integrations/accelerate_minimal.py

On a machine without a GPU, Accelerate distributes over several processes only with
``ACCELERATE_USE_CPU=1`` (or ``Accelerator(cpu=True)``, here ``--cpu``); without it each process
trains alone, and the spans say ``traceml.parallelism = independent``.

The traced model is the unwrapped one (``traceml.parallelism`` still says ``ddp`` under DDP), the
backward goes through ``accelerator.backward`` and the optimizer is Accelerate's wrapper; all three
are timed as called. One ``traceml.step`` per micro-batch: the ones that only accumulate carry
``traceml.optimizer.steps = 0``. ``--eval-every N`` evaluates every N updates, between steps, inside
``traceml.outside_step("evaluation")``.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_otel as traceml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="micro-batches per process")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer update")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N updates (0: never)")
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True): distribute on CPU")
    args = parser.parse_args()

    traceml.init(mode="auto")
    torch.set_num_threads(1)
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, cpu=args.cpu)
    torch.manual_seed(0)
    n = args.steps * args.batch_size * accelerator.num_processes
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    held_out = DataLoader(TensorDataset(torch.randn(128, 64), torch.randint(0, 4, (128,))), batch_size=32)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader, held_out = accelerator.prepare(model, optimizer, loader, held_out)
    loss_fn = nn.CrossEntropyLoss()

    updates = 0
    for x, y in loader:
        # accumulate() outside trace_step: its bookkeeping is not counted as residual of the step
        with accelerator.accumulate(model), traceml.trace_step(accelerator.unwrap_model(model)):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            updates += 1
            if args.eval_every and updates % args.eval_every == 0:
                with traceml.outside_step("evaluation"):  # its fetches are not the next step's input wait
                    evaluate(model, held_out, loss_fn)
    accelerator.print(f"final loss {loss.item():.3f}, {updates} updates")


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, loss_fn: nn.Module) -> float:
    """Between two training steps, outside every step span."""
    model.eval()
    total = sum(float(loss_fn(model(x), y)) for x, y in loader)
    model.train()
    return total


if __name__ == "__main__":
    main()
