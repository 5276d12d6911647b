"""A plain loop that updates its parameters by hand (no torch.optim optimizer), as tutorials do.

    manual_update_loop.py loader|slices   # batches from a DataLoader, or sliced from tensors
"""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x, y = torch.randn(96, 8), torch.randn(96, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
if sys.argv[1] == "loader":
    batches = DataLoader(TensorDataset(x, y), batch_size=16)
else:
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 96, 16)]
for _epoch in range(2):
    for inputs, targets in batches:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
    with torch.no_grad():  # evaluation after each epoch: no step
        model(x)
print("trained")
