"""One rank that steps, spends EVAL_S seconds in a marked evaluation (``outside_step``), steps again
and ends cleanly: ``marked_evaluation.py EVAL_S``. Prints ``evaluating`` and ``done``."""

import sys
import time

import torch
from torch import nn

import traceml_otel as traceml

evaluation_s = float(sys.argv[1])
traceml.init()
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def steps(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with traceml.trace_step(model):
            optimizer.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            optimizer.step()
            time.sleep(0.05)


steps(4)
print("evaluating", flush=True)
with traceml.outside_step("evaluation"):
    time.sleep(evaluation_s)
steps(3)
print("done", flush=True)
