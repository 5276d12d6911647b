"""A run with known time in each category: start-up sleep, evaluation, checkpoints, unnamed work
between steps, a stall inside one step, and work after the last step.

It writes what it measured itself into ``$KNOWN_TIMES_OUT.rank-R.json``, the ground truth the test
compares the analyzer's account with. Durations come from ``KNOWN_*`` variables (seconds).
"""

import json
import os
import time

STARTUP = float(os.environ.get("KNOWN_STARTUP", "2"))
time.sleep(STARTUP)  # before any import: counted from the process start

import torch  # noqa: E402

import traceml_otel as traceml  # noqa: E402

EVALUATION = float(os.environ.get("KNOWN_EVALUATION", "3"))
CHECKPOINT = float(os.environ.get("KNOWN_CHECKPOINT", "1"))
BETWEEN = float(os.environ.get("KNOWN_BETWEEN", "1"))
STALL = float(os.environ.get("KNOWN_STALL", "5"))
SHUTDOWN = float(os.environ.get("KNOWN_SHUTDOWN", "1"))
STEPS = 20

traceml.init()
rank = int(os.environ.get("RANK", "0"))
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(STEPS * 8, 32), torch.randn(STEPS * 8, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
truth = {"evaluation": 0.0, "checkpoint": 0.0, "stall": 0.0}


def timed(kind: str, seconds: float) -> None:
    began = time.time()
    with traceml.outside_step(kind):
        time.sleep(seconds)
    truth[kind] += time.time() - began


truth["first_fetch"] = time.time()
for index, (x, y) in enumerate(loader):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if index == 12:  # a stall: no progress inside a step
            began = time.time()
            time.sleep(STALL)
            truth["stall"] = time.time() - began
    if index in (4, 14):
        timed("evaluation", EVALUATION / 2)
    if index in (6, 16):
        timed("checkpoint", CHECKPOINT / 2)
    if index in (2, 8):
        time.sleep(BETWEEN / 2)  # unnamed work between steps
truth["last_step_end"] = time.time()
time.sleep(SHUTDOWN)
with open(f"{os.environ['KNOWN_TIMES_OUT']}.rank-{rank}.json", "w") as out:
    json.dump(truth, out)
