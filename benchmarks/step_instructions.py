"""What telemetry adds to each training step, counted, not timed: instructions, cache misses, bytecodes.

    .venv/bin/python benchmarks/step_instructions.py                      # this tree
    .venv/bin/python benchmarks/step_instructions.py --tree /tmp/before   # another tree (git archive)
    .venv/bin/python benchmarks/step_instructions.py --bytecodes-only     # no valgrind needed
    .venv/bin/python benchmarks/step_instructions.py --init '{"mode": "manual"}' --no-model  # no hooks
    .venv/bin/python benchmarks/step_instructions.py --model-class user  # the model in a class of the user's
    .venv/bin/python benchmarks/step_instructions.py --zero-code  # no trace_step: inferred steps

Timings on this VM move by ±50 µs per step between runs, so changes of a few µs on the training
thread cannot be seen in wall time. Counts can:

- **instructions and L1 misses per step** (valgrind's callgrind with its cache simulation, Debian
  package ``valgrind``): the loop of ``overhead_pairs.py`` (a DataLoader, ``trace_step(model)`` around
  zero_grad, forward, backward and ``optimizer.step()``, ``init(mode="auto")`` with its emitter) runs
  bare and traced, each in its own process. Only the measured steps are counted: they run inside
  one C call (``functools.reduce``), and callgrind collects inside that call alone. Start-up runs
  uninstrumented. The emitter is another process and is not counted; the watchdog thread is. The
  flush interval is raised to 20 s because valgrind runs the loop ~50× slower.
- **bytecodes per step, by function** (``sys.settrace`` with opcode events): which of our functions
  (and which of torch's, because of our hooks) run how many bytecodes more than the bare loop.

In place, between torch's calls, our code runs with cold caches: on this VM the training thread's
added cost measured in place (``in_situ_cost.py``) is about 0.4-0.5 ns per added instruction once
the L1 misses are counted, against ~7 µs for the same code in a tight loop (``hot_path.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import collections, functools, json, os, subprocess, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

mode, steps, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
init_args, traced_model, model_class = json.loads(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
inferred = sys.argv[7] == "1"  # no trace_step: zero-code tracing's step inference finds the steps
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(8192, 64), torch.randint(0, 10, (8192,)))
loader = DataLoader(data, batch_size=32)


class Net(nn.Module):  # the same layers in a class of the user's
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.layers(x)


def start_telemetry():
    global traceml
    import traceml_otel as traceml
    traceml.init(**init_args)
    if inferred:
        from traceml_otel.capture.session import current

        current().start_inference()


if mode == "traced" and not inferred:  # at the top of the script, as the README and overhead_pairs.py do
    start_telemetry()
elif mode == "traced":  # zero-code tracing records every optimizer from the moment torch is imported
    from traceml_otel.capture.optimizer_registry import OPTIMIZERS

    OPTIMIZERS.track()
model = Net() if model_class == "user" else nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
if mode == "traced" and inferred:  # zero-code tracing starts at the loop's first fetch: the optimizer exists
    start_telemetry()
batches = iter(loader)

def step(_accumulated=None, _index=None):
    global batches
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        x, y = next(batches)
    if mode == "traced" and not inferred:
        with traceml.trace_step(model if traced_model else None):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

def control(switch):
    """callgrind_control answers only while this process runs Python: spin until it is done."""
    process = subprocess.Popen(["callgrind_control", "-i", switch, str(os.getpid())],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None:
        sum(range(1000))

for _ in range(30):
    step()
if what == "instructions":
    control("on")
    functools.reduce(step, range(steps), None)  # the measured steps, inside one C call
    control("off")
else:
    counts = collections.Counter()
    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[code.co_filename.split("site-packages/")[-1] + ":" + code.co_name] += 1
        return tracer
    sys.settrace(tracer)
    for _ in range(steps):
        step()
    sys.settrace(None)
    print(json.dumps({name: count / steps for name, count in counts.items()}))
if mode == "traced":
    traceml.shutdown()
'''

EVENTS = ("Ir", "I1mr", "D1mr", "D1mw")


def instructions(child: Path, mode: str, steps: int, env: dict[str, str], out: Path,
                 variant: list[str]) -> dict[str, float]:
    """Per-step callgrind counts of one run (``variant``: the child's init arguments, model arguments)."""
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--instr-atstart=no", "--collect-atstart=no",
         "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}",
         sys.executable, str(child), mode, str(steps), "instructions", *variant],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800,
    )
    return {name: value / steps for name, value in callgrind_totals(out).items()}


def callgrind_totals(out: Path) -> dict[str, int]:
    """The event totals of a callgrind output file (``Ir``, ``I1mr``, ...)."""
    events: list[str] = []
    totals: list[int] = []
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            totals = [int(value) for value in line.split()[1:]]
    return dict(zip(events, totals, strict=True))


def bytecodes(child: Path, mode: str, steps: int, env: dict[str, str],
              variant: list[str]) -> dict[str, float]:
    result = subprocess.run([sys.executable, str(child), mode, str(steps), "bytecodes", *variant], env=env,
                            check=True, capture_output=True, text=True, timeout=600)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="a folder holding the traceml_otel package to measure (default: "
                                       "the installed one)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bytecodes-only", action="store_true")
    parser.add_argument("--init", default='{"mode": "auto"}',
                        help="init()'s keyword arguments, as JSON ('{\"mode\": \"manual\"}': no hooks)")
    parser.add_argument("--no-model", action="store_true",
                        help="trace_step() without the model (no forward timing)")
    parser.add_argument("--model-class", choices=("sequential", "user"), default="sequential",
                        help="the model: nn.Sequential (default) or the same layers in a class of the user's")
    parser.add_argument("--zero-code", action="store_true",
                        help="no trace_step: step inference finds the steps, as under `traceml run`")
    args = parser.parse_args()
    variant = [json.dumps(json.loads(args.init)), "0" if args.no_model else "1", args.model_class,
               "1" if args.zero_code else "0"]

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        child = work / "child.py"
        child.write_text(CHILD)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TRACEML_FLUSH_INTERVAL_MS="20000",
                   TRACEML_OUTPUT_DIR=str(work / "runs"))
        if args.tree:
            env["PYTHONPATH"] = str(Path(args.tree).resolve())

        bare = bytecodes(child, "bare", 100, env, variant)
        traced = bytecodes(child, "traced", 100, env, variant)
        added = {name: traced.get(name, 0.0) - bare.get(name, 0.0) for name in set(bare) | set(traced)}
        print(f"bytecodes per step: bare {sum(bare.values()):.0f}, traced {sum(traced.values()):.0f}, "
              f"added {sum(added.values()):+.0f}")
        for name, count in sorted(added.items(), key=lambda item: -abs(item[1]))[:24]:
            if abs(count) >= 1:
                print(f"  {count:+7.1f}  {name.replace(str(Path.cwd()) + '/', '')}")

        if args.bytecodes_only:
            return
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            print("valgrind not installed (Debian: apt-get install valgrind): instruction counts skipped")
            return
        counts = {mode: instructions(child, mode, args.steps, env, work / f"{mode}.out", variant)
                  for mode in ("bare", "traced")}
        print(f"per step, {args.steps} steps under callgrind (bare -> traced, added):")
        for event in EVENTS:
            before, after = counts["bare"][event], counts["traced"][event]
            print(f"  {event:5} {before:12,.0f} -> {after:12,.0f}   {after - before:+10,.0f}")


if __name__ == "__main__":
    main()
