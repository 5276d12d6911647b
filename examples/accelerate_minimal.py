"""The Hugging Face Accelerate flow with step telemetry (CPU works).

    traceml run examples/accelerate_minimal.py
    accelerate launch examples/accelerate_minimal.py   # direct launch works too

The traced model is the unwrapped one and the backward goes through
``accelerator.backward``; both are captured by the automatic hooks.
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
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer update")
    args = parser.parse_args()

    traceml.init(mode="auto")
    torch.set_num_threads(1)
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    torch.manual_seed(0)
    n = args.steps * args.batch_size
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss_fn = nn.CrossEntropyLoss()

    for x, y in loader:
        with traceml.trace_step(accelerator.unwrap_model(model)), accelerator.accumulate(model):
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
