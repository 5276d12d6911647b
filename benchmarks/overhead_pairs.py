"""Telemetry on against ``TRACEML_DISABLED=1``, in interleaved pairs of real ``traceml run`` launches.

    .venv/bin/python benchmarks/overhead_pairs.py                  # 6 pairs of each scenario (~10 min)
    .venv/bin/python benchmarks/overhead_pairs.py --pairs 10 --scenario fast

Each run launches ``traceml run`` on a small torch training script (one torch thread, a DataLoader,
``trace_step(model)`` in auto mode, the local copy on, no OTLP endpoint: the default a new user gets),
once with telemetry on and once with ``TRACEML_DISABLED=1``; the order inside a pair alternates.
The script measures, over its steps after a warm-up:

- wall time per step (median and mean of the per-step ``perf_counter`` readings);
- process-tree CPU per step: the CPU time (``/proc/PID/task/*/schedstat``, in ns) of every
  process under ``traceml run`` (the launcher, the training process, its emitter) from the first
  measured step until the emitter has gone idle after the last one (it finishes its last batches
  then), divided by the steps. Unlike wall time this barely moves with the machine's load.

Scenarios: ``fast`` (~0.5 ms CPU steps), ``hogs`` (~2 ms steps while two busy-loop processes
compete for the CPUs). Printed: each pair's differences, then the median and the spread (min..max)
over the pairs, and the 1-minute load average at the start of every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINER = r'''
import json, os, statistics, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import traceml_otel as traceml

STEPS, WARMUP, HIDDEN = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


def tree_pids(root):
    """root and every process below it (read once: the launcher, this process, its emitter)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sorted(tree)


def tree_cpu_ns(pids):
    """CPU ns of these processes, every thread (/proc/PID/task/TID/schedstat)."""
    total = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                    total += int(stat.read().split()[0])
        except OSError:
            pass
    return total


traceml.init(mode="auto")
torch.manual_seed(0)
torch.set_num_threads(1)
n = 256 * 32
data = TensorDataset(torch.randn(n, HIDDEN), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=32, shuffle=False)
model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()


def batches():
    while True:
        yield from loader


source = batches()
time.sleep(2.0)  # the emitter finishes starting (imports) before anything is measured
pids = tree_pids(os.getppid())  # traceml run and everything below it


def settle():
    """Wait until the tree is idle (< 2 ms CPU in 300 ms): the emitter has caught up. Returns its CPU."""
    previous = tree_cpu_ns(pids)
    for _ in range(100):
        time.sleep(0.3)
        now = tree_cpu_ns(pids)
        if now - previous < 2_000_000:
            return now
        previous = now
    return previous


def per_task():
    """CPU ns of each thread of the tree, by process and thread name."""
    rows = {}
    for pid in pids:
        try:
            name = open(f"/proc/{pid}/comm").read().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                rows[f"{pid} {name} {tid}"] = ns
        except OSError:
            pass
    return rows


walls = []
for step in range(WARMUP + STEPS):
    if step == WARMUP:  # the warm-up's steps are written and every process has finished starting
        settle()
        tasks_started = per_task()
        cpu_started = tree_cpu_ns(pids)
    started = time.perf_counter_ns()
    x, y = next(source)
    with traceml.trace_step(model):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    if step >= WARMUP:
        walls.append(time.perf_counter_ns() - started)
previous = settle()  # the emitter writes the last batches after the loop
tasks = {name: (ns - tasks_started.get(name, 0)) / STEPS for name, ns in per_task().items()}
result = {"median_ns": statistics.median(walls), "mean_ns": statistics.fmean(walls),
          "tree_cpu_ns": (previous - cpu_started) / STEPS, "processes": len(pids),
          "tasks_ns": {name: ns for name, ns in tasks.items() if ns > 500}}
with open(os.environ["OVERHEAD_PAIRS_OUT"], "w") as out:
    json.dump(result, out)
'''

SCENARIOS = {"fast": (64, 0), "hogs": (512, 2)}
"""Hidden width (~0.5 ms and ~2 ms CPU steps on a 2-core VM) and the number of CPU hogs."""


def run_once(script: Path, telemetry: bool, steps: int, warmup: int, hidden: int, workdir: Path) -> dict:
    out = workdir / "result.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "OVERHEAD_PAIRS_OUT": str(out), "TRACEML_RUNS_DIR": str(workdir / "runs")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("TRACEML_DISABLED", None)
    if not telemetry:
        env["TRACEML_DISABLED"] = "1"
    traceml = Path(sys.executable).with_name("traceml")
    command = [str(traceml), "run", "--no-report", str(script), str(steps), str(warmup), str(hidden)]
    subprocess.run(command, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):+8.1f}   spread {min(values):+.1f}..{max(values):+.1f}"


def scenario(name: str, pairs: int, steps: int, warmup: int, workdir: Path, script: Path,
             show_tasks: bool = False) -> None:
    hidden, hog_count = SCENARIOS[name]
    wall_us, wall_pct, mean_us, cpu_us, loads, bare = [], [], [], [], [], []
    hogs = _hogs(hog_count)
    try:
        for pair in range(pairs):
            results = {}
            for telemetry in ((True, False) if pair % 2 == 0 else (False, True)):
                loads.append(os.getloadavg()[0])
                results[telemetry] = run_once(script, telemetry, steps, warmup, hidden, workdir)
            on, off = results[True], results[False]
            wall_us.append((on["median_ns"] - off["median_ns"]) / 1000)
            wall_pct.append((on["median_ns"] / off["median_ns"] - 1) * 100)
            mean_us.append((on["mean_ns"] - off["mean_ns"]) / 1000)
            cpu_us.append((on["tree_cpu_ns"] - off["tree_cpu_ns"]) / 1000)
            bare.append(off["median_ns"] / 1000)
            if show_tasks:
                for label, result in (("on", on), ("off", off)):
                    busy = ", ".join(f"{task}: {ns / 1000:.0f}" for task, ns in result["tasks_ns"].items())
                    print(f"    {label}: us/step by thread: {busy}")
            print(f"  {name} pair {pair + 1}: bare step {off['median_ns'] / 1e6:.3f} ms   wall "
                  f"{wall_us[-1]:+7.1f} us ({wall_pct[-1]:+.2f} %)   mean {mean_us[-1]:+7.1f} us   "
                  f"tree CPU {cpu_us[-1]:+7.1f} us/step (on {on['tree_cpu_ns'] / 1000:.0f}, "
                  f"off {off['tree_cpu_ns'] / 1000:.0f})", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    bare_ms = statistics.median(bare) / 1000
    print(f"{name}: {pairs} pairs, {steps} steps each, bare step median {bare_ms:.3f} ms, "
          f"{hog_count} CPU hogs, load average {min(loads):.1f}..{max(loads):.1f}")
    print(f"  wall per step (median step), us:   {_spread(wall_us)}")
    print(f"  wall per step (median step), %:    {_spread(wall_pct)}")
    print(f"  wall per step (mean step), us:     {_spread(mean_us)}")
    print(f"  process-tree CPU per step, us:     {_spread(cpu_us)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3008, help="measured steps per run (a multiple of 64)")
    parser.add_argument("--warmup", type=int, default=192)
    parser.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    parser.add_argument("--tasks", action="store_true", help="also print each thread's CPU per step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="overhead-pairs-") as temporary:
        workdir = Path(temporary)
        script = workdir / "trainer.py"
        script.write_text(TRAINER)
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        for name in SCENARIOS if args.scenario == "all" else [args.scenario]:
            started = time.monotonic()
            scenario(name, args.pairs, args.steps, args.warmup, workdir, script, args.tasks)
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
