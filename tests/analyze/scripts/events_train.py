"""Stalls, straggler patterns and phases on a small DDP (gloo) job: ``events_train.py SCENARIO``.

Scenarios (``EVENTS_STEPS`` steps, ``EVENTS_WINDOW`` steps per straggler window):

- ``stall``: rank 1 sleeps ``EVENTS_STALL_S`` seconds once, inside step ``EVENTS_AT`` (30), then goes on;
- ``chronic``: rank 1 is slow on every step;
- ``rotating``: window w's steps are slow on rank ``w % world``;
- ``transient``: rank 1 is slow in one window only (steps 2 x window to 3 x window - 1);
- ``onset``: rank 1 is slow from step 5 x window to the end (a rank that became slow mid-run);
- ``phases``: every rank compiles (a step 0 of 80 base steps, then slow first steps), steadies, and slows
  by 40 % for its last third (the warm-up holds most of the raw training time);
- ``healthy``: nothing planted.

The extra time is a sleep inside the traced step, before the forward (``SLOW_S`` per step).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import traceml_otel as traceml

SCENARIO = sys.argv[1]
STEPS = int(os.environ.get("EVENTS_STEPS", "60"))
WINDOW = int(os.environ.get("EVENTS_WINDOW", "20"))
AT = int(os.environ.get("EVENTS_AT", "30"))
STALL_S = float(os.environ.get("EVENTS_STALL_S", "8"))
BASE_S = float(os.environ.get("EVENTS_BASE_S", "0.01"))
SLOW_S = float(os.environ.get("EVENTS_SLOW_S", "0.02"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))


def stall():
    time.sleep(STALL_S)  # EVENTS-STALL


def extra(step: int) -> float:
    """Seconds this rank sleeps on top of the base in ``step``."""
    window = step // WINDOW
    if SCENARIO == "chronic":
        return SLOW_S if RANK == 1 else 0.0
    if SCENARIO == "rotating":
        return SLOW_S if RANK == window % WORLD else 0.0
    if SCENARIO == "transient":
        return SLOW_S if RANK == 1 and window == 2 else 0.0
    if SCENARIO == "onset":
        return SLOW_S if RANK == 1 and window >= 5 else 0.0
    if SCENARIO == "phases":
        if step == 0:
            return 80 * BASE_S  # a one-off compile (a torch.compile step 0 takes seconds)
        if step < STEPS // 15:
            return 4 * BASE_S  # compiling
        return 0.4 * BASE_S if step >= STEPS - STEPS // 3 else 0.0
    return 0.0


def main():
    torch.set_num_threads(1)
    traceml.init()
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        with traceml.trace_step(model):
            if SCENARIO == "stall" and step == AT and RANK == 1:
                stall()
            time.sleep(BASE_S + extra(step))
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()
    print(f"rank {RANK} finished {STEPS} steps", flush=True)


if __name__ == "__main__":
    main()
