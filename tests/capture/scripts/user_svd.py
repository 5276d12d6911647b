"""A user's training script with a planted slow operation: every 40th step a large SVD nothing else uses.
Plain, as a user writes it (no options): ``traceml run user_svd.py``.

800 steps of ~1 ms (about 2 s of training): a trigger's request reaches the rank 0.3-0.5 s after its
spike on a loaded machine (the 250 ms flush, the emitter, the 0.2 s poll), hundreds of these steps;
at 400 steps the run once ended before the next predicted svd."""

import torch

import traceml_otel as traceml

traceml.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
matrix = torch.randn(512, 512)
for step in range(800):
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    with traceml.trace_step(model):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 40 == 39:
            torch.linalg.svd(matrix)
traceml.shutdown()
