"""A short loop with slow input, an evaluation every 10 steps and a checkpoint: every time category
and every phase the HTML charts draw."""

import time

import torch
from torch.utils.data import DataLoader, Dataset

import traceml_otel as traceml


class Slow(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        time.sleep(0.002)
        return torch.randn(16), torch.randn(4)


traceml.init(mode="auto")
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for index, (x, y) in enumerate(DataLoader(Slow(), batch_size=4)):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if index % 5 == 4:
        with traceml.outside_step("evaluation"):
            time.sleep(0.05)
with traceml.outside_step("checkpoint"):
    time.sleep(0.05)
