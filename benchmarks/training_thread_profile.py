"""What telemetry costs the training thread per step, function by function, through the public API.

    .venv/bin/python benchmarks/training_thread_profile.py [--steps 1000] [--rounds 7] [--top 40]

One child process runs the loop of ``benchmarks/overhead_pairs.py`` (one torch thread, a DataLoader,
``trace_step(model)`` around zero_grad, forward, backward and ``optimizer.step()``): first after
``init(disabled=True)`` (what ``TRACEML_DISABLED=1`` gives: blocks that do nothing), then after a real
``init(mode="auto")`` (its emitter process, the local copy into a temporary folder, no OTLP endpoint).
For each it reports:

- **Python calls per iteration** under ``cProfile`` (exact: load cannot blur it) and every function
  whose count differs between on and off, with its calls and its own time per iteration (inflated by
  the profiler: read the times as shares);
- the **training thread's CPU per step** (``time.thread_time_ns``, no profiler) of ``--rounds`` blocks
  of ``--steps`` steps: best and median. On a shared 2-core machine the blocks move by +-100 us from one
  to the next, so only the call counts and ``benchmarks/hot_path.py``'s best-of-five loops resolve a
  few microseconds;
- the **garbage collections per 1,000 steps** (``gc.callbacks``; generation 0 runs every 700 net
  container allocations, so this counts what the hot path keeps alive per step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import cProfile, gc, json, os, pstats, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import traceml_otel as traceml
from traceml_otel import session_root

STEPS, ROUNDS, PROFILED = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(1)
n = 256 * 32
data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=32, shuffle=False)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()


def batches():
    while True:
        yield from loader


source = batches()


def step():
    x, y = next(source)
    with traceml.trace_step(model):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()


def measure():
    for _ in range(300):
        step()
    time.sleep(1.0)  # an emitter finishes starting (imports) before anything is measured
    cpu = []
    collections = [0]
    gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "stop")))
    for _ in range(ROUNDS):
        started = time.thread_time_ns()
        for _ in range(STEPS):
            step()
        cpu.append((time.thread_time_ns() - started) / STEPS / 1000)
        time.sleep(0.1)
    gc.callbacks.clear()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(PROFILED):
        step()
    profile.disable()
    functions = {}
    for (path, line, name), (_, calls, own, _cumulative, _) in pstats.Stats(profile).stats.items():
        short = path if path.startswith("<") or path == "~" else path.split("site-packages/")[-1]
        short = short.split("/traceml_otel/")[-1] if "/traceml_otel/" in short else short
        functions[f"{short}:{line}({name})"] = (calls / PROFILED, own * 1e6 / PROFILED)
    return {"cpu_us": cpu, "gc_per_1000": collections[0] * 1000 / (STEPS * ROUNDS),
            "calls": sum(c for c, _ in functions.values()), "functions": functions}


traceml.init(disabled=True)  # what TRACEML_DISABLED=1 gives: trace_step() blocks that do nothing
off = measure()
session_root._init_config = None  # a benchmark's licence: init() again, for real this time
assert traceml.init(mode="auto")
on = measure()
print(json.dumps({"off": off, "on": on}))
traceml.shutdown()
'''


def run(args: argparse.Namespace, folder: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "OTEL_"))}
    env.update(TRACEML_RUNS_DIR=folder)
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.steps), str(args.rounds), str(args.profiled)],
                         env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profiled", type=int, default=1000)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = run(args, folder)
    off, on = result["off"], result["on"]
    print(f"Python calls per iteration: off {off['calls']:.1f}, on {on['calls']:.1f}, "
          f"added {on['calls'] - off['calls']:+.1f}")
    for name, result in (("off", off), ("on", on)):
        cpu = result["cpu_us"]
        blocks = ", ".join(f"{v:.1f}" for v in cpu)
        print(f"training-thread CPU per step, {name}: best {min(cpu):.1f} us, median "
              f"{statistics.median(cpu):.1f} us (blocks: {blocks})")
    print(f"added: best {min(on['cpu_us']) - min(off['cpu_us']):+.1f} us, median "
          f"{statistics.median(on['cpu_us']) - statistics.median(off['cpu_us']):+.1f} us")
    print(f"garbage collections per 1,000 steps: off {off['gc_per_1000']:.1f}, on {on['gc_per_1000']:.1f}")
    rows = []
    for key in set(on["functions"]) | set(off["functions"]):
        calls_on, own_on = on["functions"].get(key, (0.0, 0.0))
        calls_off, _ = off["functions"].get(key, (0.0, 0.0))
        if abs(calls_on - calls_off) >= 0.01:
            rows.append((calls_on - calls_off, own_on, key))
    rows.sort(key=lambda row: (-abs(row[0]), -row[1]))
    print(f"\nfunctions whose calls per iteration differ (on - off), top {args.top}; "
          "own us/iteration under cProfile:")
    for added, own, key in rows[:args.top]:
        print(f"{added:+8.2f}  {own:7.2f} us  {key}")


if __name__ == "__main__":
    main()
