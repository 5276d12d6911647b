"""Ends with a top-level ``raise SystemExit(N)`` (not ``sys.exit``): ``raise_exit.py N [explicit]``.

``explicit``: the script calls ``traceml.init()`` and ``trace_step``; otherwise it is an unmodified
script (zero-code: ``traceml run`` attaches and infers the steps from the optimizer).
"""

import sys
import time

import torch
from torch import nn

explicit = len(sys.argv) > 2 and sys.argv[2] == "explicit"
if explicit:
    import traceml_otel as traceml

    traceml.init()
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(12):
    if explicit:
        with traceml.trace_step(model):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    else:
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.01)
raise SystemExit(int(sys.argv[1]))
