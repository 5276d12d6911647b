"""Changes its working directory before ``traceml.init()``, then trains 30 steps; with ``--hang`` the
last step blocks in a C call (``os.read`` on a pipe nobody writes) until the job is ended."""

import os
import sys
import time

import torch
from torch import nn

import traceml_otel as traceml

os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")  # the rank's cwd is no longer the launch directory
traceml.init()
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
hang = "--hang" in sys.argv
for step in range(30):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        time.sleep(0.01)
        if hang and step == 29:
            os.read(os.pipe()[0], 1)
print("done", flush=True)
