"""Handles preemption itself, as schedulers ask: its SIGTERM handler (installed before
``traceml.init()``) notes the time and sets a flag; the script trains on to step 99, saves and exits 0.
Prints ``step N`` after each step; ``PREEMPT_OUT`` gets the handler's time and the steps run after it."""

import json
import os
import signal
import sys
import time

handled: list[float] = []
signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(time.time()))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import traceml_otel as traceml  # noqa: E402

traceml.init()
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
after = 0
for step in range(100):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        time.sleep(0.01)
    if step == 49:
        sys.stdout.write("step 49\n")
        sys.stdout.flush()
        while not handled:  # the test sends SIGTERM now
            time.sleep(0.005)
    elif handled:
        after += 1
with open(os.environ["PREEMPT_OUT"], "w") as out:  # "saves"
    json.dump({"handled_at": handled[0], "steps_after": after}, out)
sys.exit(0)
