"""Many short steps (a tiny model padded to --step-ms by spinning); prints timing lines.

Prints ``loop_done <unix time>`` when the training loop ends, so a caller can time the exit.
"""

import argparse
import time

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--step-ms", type=float, default=0.5)
args = parser.parse_args()

traceml.init(mode="auto")
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
step_ns = int(args.step_ms * 1e6)
started = time.perf_counter()
for _ in range(args.steps):
    with traceml.trace_step(model):
        begin = time.perf_counter_ns()
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        while time.perf_counter_ns() - begin < step_ns:
            pass
print(f"loop_s {time.perf_counter() - started:.3f}", flush=True)
print(f"loop_done {time.time():.6f}", flush=True)
