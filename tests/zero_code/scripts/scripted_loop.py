"""A plain loop over a TorchScript model (no traceml import): zero-code tracing must not break it."""

import torch

torch.manual_seed(0)
torch.set_num_threads(1)
layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = torch.jit.script(layers)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
print("trained")
