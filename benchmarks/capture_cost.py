"""What a deep capture costs the steps it covers, on this machine (``docs/captures.md``).

    .venv/bin/python benchmarks/capture_cost.py                 # CPU, stacks on and off
    .venv/bin/python benchmarks/capture_cost.py --device cuda   # the CUDA activities path too

A real ``traceml run`` of a steady loop (a 2-layer MLP, ``--width``; on ``cuda`` the model and the batch
on the GPU) asks itself for ``--captures`` on-demand captures of ``--steps`` steps each (the run
folder's ``capture-request.json``, as ``traceml capture`` writes it), a few seconds apart. Afterwards
it reads the step table and the capture summaries and prints, per capture and over all of them:
the captured steps' median wall time against the median of the 50 uncaptured steps before it (the
slowdown), the profiler's start and stop time (kept out of the steps), the export time (off the
training thread) and the trace's size. Each variant (``with_stack`` on, off) is its own run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOOP = r'''
import sys, time, torch
import traceml_otel as traceml
steps, width, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
traceml.init()
torch.set_num_threads(1)
layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8)]
model = torch.nn.Sequential(*layers).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, width, device=device), torch.randint(0, 8, (64,), device=device)
for step in range(steps):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    time.sleep(0.01)
traceml.shutdown()
'''


def one_run(workdir: Path, stack: bool, args: argparse.Namespace) -> list[dict]:
    """One ``traceml run``; asks for the captures while it runs; returns one row per capture."""
    script = workdir / "loop.py"
    script.write_text(LOOP)
    runs = workdir / f"runs-{int(stack)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(runs), TRACEML_CAPTURE_AUTO="0", TRACEML_CAPTURE_MAX=str(args.captures),
               TRACEML_CAPTURE_STEPS=str(args.steps), TRACEML_CAPTURE_STACK="1" if stack else "0",
               TRACEML_CAPTURE_INTERVAL_S="0")
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", str(script), "--",
               str(args.total), str(args.width), args.device]
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(args.first_s)
    (run_dir,) = runs.iterdir()
    for index in range(args.captures):
        subprocess.run([sys.executable, "-m", "traceml_otel.cli", "capture", str(run_dir), "--wait", "60"],
                       env=env, stdout=subprocess.DEVNULL, check=False)
        time.sleep(args.gap_s if index < args.captures - 1 else 0)
    job.wait(timeout=600)
    times = {int(r["step"]): float(r["traced_cpu"]) * 1e3
             for r in csv.DictReader((run_dir / "rank-0.steps.csv").open())}
    rows = []
    for path in sorted(run_dir.glob("rank-0.capture-*.json")):
        if path.name.endswith("trace.json.gz") or "request" in path.name or "status" in path.name:
            continue
        summary = json.loads(path.read_text())
        steps = summary["steps"]
        if not steps:
            continue
        before = [times[s] for s in range(steps[0] - 50, steps[0]) if s in times]
        captured = [times[s] for s in steps if s in times]
        rows.append({"stack": stack, "before_ms": statistics.median(before),
                     "captured_ms": statistics.median(captured),
                     "start_s": summary["limits"].get("start_s"), "stop_s": summary["limits"].get("stop_s"),
                     "export_s": summary["export_s"], "trace_kib": summary["trace_bytes"] / 1024,
                     "activities": summary["activities"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--captures", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="steps per capture")
    parser.add_argument("--total", type=int, default=1500, help="steps of the loop (10 ms apart)")
    parser.add_argument("--first-s", type=float, default=8.0, help="seconds before the first request")
    parser.add_argument("--gap-s", type=float, default=2.0, help="seconds between requests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capture-cost-") as temporary:
        for stack in (True, False):
            rows = one_run(Path(temporary), stack, args)
            name = f"with_stack={int(stack)} {args.device}"
            for row in rows:
                print(f"{name}: step {row['before_ms']:.2f} ms -> captured {row['captured_ms']:.2f} ms "
                      f"(x{row['captured_ms'] / row['before_ms']:.2f}); start {row['start_s']} s, stop "
                      f"{row['stop_s']} s (outside the steps); export {row['export_s']} s off-thread; "
                      f"trace {row['trace_kib']:.0f} KiB; activities {row['activities']}", flush=True)
            if rows:
                ratios = [r["captured_ms"] / r["before_ms"] for r in rows]
                print(f"{name}: captured steps x{statistics.median(ratios):.2f} (median of {len(rows)} "
                      f"captures; spread {min(ratios):.2f}..{max(ratios):.2f})", flush=True)
            else:
                print(f"{name}: no capture was taken", flush=True)


if __name__ == "__main__":
    main()
