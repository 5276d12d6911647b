"""A user's loop: trace_step around each training step, and every 60 steps an evaluation pass over a
validation set that no outside_step marks (forwards under no_grad, a .item() per batch)."""

import os

import torch
from torch import nn

import traceml_otel as traceml

EVAL_BATCHES = int(os.environ.get("EVAL_BATCHES", "30000"))
traceml.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(32 * 180, 128), torch.randint(0, 10, (32 * 180,)))
validation = [torch.randn(32, 128) for _ in range(200)]
for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=32)):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if step % 60 == 59 and step < 179:
        model.eval()
        with torch.no_grad():
            loss = sum(model(validation[i % 200]).square().mean().item() for i in range(EVAL_BATCHES))
        model.train()
