"""A user's training script that reads a metric with ``.item()`` every step (a host sync, residual time).
Plain, as a user writes it (no options): ``traceml run user_item_metric.py``."""

import torch

import traceml_otel as traceml

traceml.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
seen = correct = 0
for _step in range(1000):
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    with traceml.trace_step(model):
        optimizer.zero_grad()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        confidence = logits.softmax(-1)
        for _ in range(12):
            confidence = (confidence @ confidence.T @ confidence).softmax(-1)
        correct += int((confidence.argmax(1) == y).sum().item())
        seen += len(y)
traceml.shutdown()
print(f"accuracy {correct / seen:.3f}")
