"""A rank that dies with SIGSEGV while a deep capture runs on it, as a crash inside torch's profiler
would end it; restarted by torchrun (``--max-restarts 1``), the next attempt trains to the end.

The first attempt asks for a capture on demand at step 8 (the run's ``capture-request.json``) and kills
itself in the first step it sees the profiler on. A later attempt asks, at step 12, for an automatic
capture (the rank's ``capture-request.json``, as its emitter's triggers write it). Every attempt writes
``attempt-<N>.json`` into the run folder: the restart count and whether a profiler was ever on in it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch

import traceml_otel as traceml
from traceml_otel.wire.capture_record import REQUEST_FILE, CaptureRequest, request_file_name, write_request

STEPS = 60
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
run_dir = Path(os.environ["TRACEML_RUNS_DIR"]) / os.environ["TRACEML_RUN_ID"]
traceml.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
profiled = False
for step in range(STEPS):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        on = bool(torch._C._autograd._profiler_enabled())
        profiled = profiled or on
        if on and attempt == 0:
            os.kill(os.getpid(), signal.SIGSEGV)  # what a crash inside the profiler does to the rank
    if step == 8 and attempt == 0:
        write_request(run_dir / REQUEST_FILE, CaptureRequest(id="crash-test", reason="on_demand",
                                                             requested_unix=time.time()))
    if step == 12 and attempt > 0:  # what the emitter's triggers would ask: refused in this attempt
        automatic = CaptureRequest(id="auto-after-restart", reason="spike", requested_unix=time.time(),
                                   wasted_s=100.0)
        write_request(run_dir / request_file_name(0), automatic)
    time.sleep(0.03)
(run_dir / f"attempt-{attempt}.json").write_text(json.dumps({"attempt": attempt, "profiled": profiled}))
