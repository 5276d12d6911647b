"""An unmodified plain training loop: no traceml import, no ``trace_step`` (zero-code tracing test).

    plain_loop.py

6 updates of a tiny model from a DataLoader, one evaluation pass after update 3. After update 4 (past
step inference's warm-up) the script copies the model as users do: an EMA-style ``copy.deepcopy``,
called in train mode inside each later step, and a whole-model ``torch.save`` / ``torch.load``
round trip. Prints one JSON line at the end: whether any traceml module was loaded in this process.
"""

import copy
import io
import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

UPDATES = 6

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(TensorDataset(torch.randn(8 * UPDATES, 16), torch.randn(8 * UPDATES, 1)), batch_size=8)
val = DataLoader(TensorDataset(torch.randn(16, 16), torch.randn(16, 1)), batch_size=8)
ema = None
for i, (x, y) in enumerate(train):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if ema is not None:
        ema(x)  # a copy's forward, gradients on, in train mode, inside the step
    optimizer.step()
    if i == 3:
        ema = copy.deepcopy(model)
        checkpoint = io.BytesIO()
        torch.save(model, checkpoint)
        checkpoint.seek(0)
        restored = torch.load(checkpoint, weights_only=False)
        with torch.no_grad():
            assert torch.equal(restored(x), model(x))
    if i == 2:
        model.eval()
        with torch.no_grad():
            for xv, _ in val:
                model(xv)
        model.train()
print(json.dumps({"traceml_loaded": any(name.startswith("traceml_otel") for name in sys.modules)}))
