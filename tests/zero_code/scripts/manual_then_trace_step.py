"""Three updates by hand (inferred steps, one per backward), then five trace_step blocks: the
explicit steps end where their blocks end, not at their backward."""

import time

import torch

import traceml_otel as traceml

model = torch.nn.Linear(8, 1)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for _ in range(3):  # by hand, inferred
    torch.nn.functional.mse_loss(model(x), y).backward()
for _ in range(5):
    with traceml.trace_step(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
                parameter.grad = None
        time.sleep(0.03)  # the rest of the block: inside the step
print("ok")
