"""A plain loop whose updates take a closure (``optimizer.step(closure)``, as LBFGS needs), no
DataLoader: under zero-code tracing, telemetry starts at the first forward, inside the first update."""

import sys

import torch

torch.manual_seed(0)
x, y = torch.randn(64, 8), torch.randn(64, 1)
model = torch.nn.Linear(8, 1)
if sys.argv[1] == "sgd":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
else:
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)


def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for _ in range(6):
    optimizer.step(closure)
print("trained")
