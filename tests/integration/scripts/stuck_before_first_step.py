"""Two gloo ranks: rank 1 is stuck before its first step (a long checkpoint load, say); rank 0 waits
for it in a barrier. Used by test_stack_hang_live.py."""

import os
import time

import torch
import torch.distributed as dist

import traceml_otel as traceml

traceml.init()
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(float(os.environ.get("STUCK_S", "120")))  # stuck before the first step
dist.barrier()
model = torch.nn.Linear(4, 1)
for _ in range(5):
    with traceml.trace_step(model):
        model(torch.ones(8, 4)).sum().backward()
