"""A run with known time in each category: start-up sleep, evaluation, checkpoints, unnamed work
between steps, a stall inside one step, and work after the last step (the loop's fetch written out
with ``next()`` so the script can time the gaps between steps itself).

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
WIDTH, LAYERS, MICRO, ACCUMULATION = 64, 4, 8, 4
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
data = torch.utils.data.TensorDataset(torch.randn(STEPS * MICRO * ACCUMULATION, WIDTH))
loader = torch.utils.data.DataLoader(data, batch_size=MICRO * ACCUMULATION)
# Analytic FLOPs of one step: per micro-batch, forward 2*B*d*d per layer; backward 4*B*d*d per layer
# less the first layer's input gradient (its input needs none): 2*B*d*d.
FLOPS_PER_STEP = ACCUMULATION * (6 * MICRO * WIDTH * WIDTH * LAYERS - 2 * MICRO * WIDTH * WIDTH)
truth = {"evaluation": 0.0, "checkpoint": 0.0, "stall": 0.0, "flops_per_step": FLOPS_PER_STEP,
         "step_seconds": [], "gap_seconds": []}
def timed(kind: str, seconds: float) -> None:
    began = time.time()
    with traceml.outside_step(kind):
        time.sleep(seconds)
    truth[kind] += time.time() - began


# between steps: each gap from a step's end to the next fetch, less its outside_step blocks. Measured,
# not taken as BETWEEN: on a loaded host the sleeps overshoot and the loop itself waits for a CPU
# (4 busy processes on 2 cores once made the gaps 1.037 s for BETWEEN=1, all of it real).
truth["between"] = 0.0
truth["first_fetch"] = time.time()
batches = iter(loader)  # the loop's fetch written out, so the gap's end is timed before it
step_ended, outside_before = None, 0.0
for index in range(STEPS):
    fetch_began = time.time()
    (x,) = next(batches)
    if step_ended is not None:
        outside_since = truth["evaluation"] + truth["checkpoint"] - outside_before
        truth["between"] += fetch_began - step_ended - outside_since
    step_began = time.time()
    if step_ended is not None:  # the quiet time between two steps, less the outside_step blocks
        truth["gap_seconds"].append(step_began - step_ended - outside_since)
    with traceml.trace_step(model, flops=FLOPS_PER_STEP, measure_flops=index == 1):
        optimizer.zero_grad()
        for micro in x.chunk(ACCUMULATION):  # gradient accumulation: 4 micro-batches, one update
            (model(micro).square().mean() / ACCUMULATION).backward()
        optimizer.step()
        if index == 12:  # a stall: no progress inside a step
            began = time.time()
            time.sleep(STALL)
            truth["stall"] = time.time() - began
    step_ended, outside_before = time.time(), truth["evaluation"] + truth["checkpoint"]
    truth["step_seconds"].append(step_ended - step_began)  # a starved step past the hang timeout stalls
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
