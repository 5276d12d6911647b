"""An input-bound loop whose DataLoader already has one worker per usable CPU."""

import argparse
import os
import time

import torch
from torch import nn

import traceml_otel as traceml


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.thread_time() + 0.002  # decoding: CPU work (a sleep would be a read, which more
        while time.thread_time() < end:   # workers overlap: the advice measures the workers' CPU)
            pass
        return torch.randn(8)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()
traceml.init(mode="auto")
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
cpus = len(os.sched_getaffinity(0))
loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=8, num_workers=cpus, persistent_workers=True,
                                     prefetch_factor=4)
for step, x in enumerate(loader):
    if step == args.steps:
        break
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
print(f"num_workers={cpus}")
