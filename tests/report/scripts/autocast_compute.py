"""A compute-bound loop, under ``torch.autocast`` (``--autocast``), in bf16 weights (``--bf16``) or in
fp32: the user's own loop, written without any traceml hint about its precision."""

import sys

import torch
from torch.utils.data import DataLoader

import traceml_otel as traceml

traceml.init(mode="auto")
torch.manual_seed(0)
dtype = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
layers = [torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
          torch.nn.Linear(2048, 512)]
model = torch.nn.Sequential(*layers).to(dtype)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = [(torch.randn(128, 512, dtype=dtype), torch.randn(128, 512, dtype=dtype)) for _ in range(30)]
for x, y in DataLoader(batches, batch_size=None):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled="--autocast" in sys.argv):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
