"""Three updates by hand (inferred steps, one per backward), then an optimizer and five updates with
two micro-batches each: from the optimizer on, a step ends at its update, not at each backward."""

import torch

model = torch.nn.Linear(8, 1)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for _ in range(3):  # by hand
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.01 * parameter.grad
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    optimizer.zero_grad()
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
print("ok")
