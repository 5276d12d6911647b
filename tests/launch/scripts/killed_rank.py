"""A 2-rank gloo DDP job in which one rank is killed outright (SIGKILL, as the OOM killer does) mid-run.

``killed_rank.py KILL_RANK KILL_AT STEPS``: rank KILL_RANK SIGKILLs itself after step KILL_AT; the
other rank then fails in its next all-reduce (a gloo error) or is stopped by the agent (SIGTERM).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import traceml_otel as traceml

kill_rank, kill_at = int(sys.argv[1]), int(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 400
dist.init_process_group("gloo")
traceml.init()
rank = dist.get_rank()
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(steps):
    with traceml.trace_step(model):
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        time.sleep(0.02)
    if i == kill_at and rank == kill_rank:
        time.sleep(0.5)  # its last steps reach the emitter; the kill lands between steps
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdout.write(f"rank {rank} completed {i}\n")
    sys.stdout.flush()
dist.destroy_process_group()
