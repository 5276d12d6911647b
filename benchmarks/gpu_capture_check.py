"""Prove deep captures' CUDA path on a real GPU in one short run (``docs/captures.md``).

    python benchmarks/gpu_capture_check.py [--out DIR]

A ``traceml run`` of a small CUDA training loop whose every 25th step runs a large ``torch.linalg.svd``
on the GPU (spike trigger; a ~3 min budget at most). Checks, each printed, exit status 1 if one fails:

- at least one automatic capture covers an svd step, with activities ``cpu`` and ``cuda``;
- its summary's device table is not empty and names an svd kernel or operator among its top 5 by
  self device time (the CUDA activities were recorded, not only the CPU side);
- its trace (gzip, Chrome JSON) holds GPU kernel events (``cat`` ``kernel``);
- the captured steps' slowdown and the export time, printed (the number docs/captures.md asks for).

Then ``benchmarks/capture_cost.py --device cuda`` gives the slowdown of on-demand captures of steady
steps. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = r'''
import sys, time, torch
import traceml_otel as traceml
traceml.init()
steps, every = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 1024, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
big = torch.randn(2048, 2048, device="cuda")
for step in range(steps):
    with traceml.trace_step(model):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step % every == every - 1:
            torch.linalg.svd(big)
    time.sleep(0.005)
traceml.shutdown()
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="keep the run folder here")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=25)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-capture-")) if args.out is None else args.out
    work.mkdir(parents=True, exist_ok=True)
    script = work / "loop.py"
    script.write_text(LOOP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(work / "runs"), TRACEML_CAPTURE_INTERVAL_S="0",
               TRACEML_CAPTURE_BUDGET="1")  # a short check: the cost budget would refuse its captures
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", str(script), "--",
               str(args.steps), str(args.every)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    print(result.stderr[-1500:])
    failures = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failures.append(what)

    check(result.returncode == 0, f"traceml run exited {result.returncode}")
    runs = list((work / "runs").iterdir()) if (work / "runs").exists() else []
    run_dir = runs[0] if runs else work
    summaries = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank-0.capture-*.json"))
                 if "request" not in p.name and "status" not in p.name]
    covering = [s for s in summaries if any(step % args.every == args.every - 1 for step in s["steps"])]
    check(bool(covering), f"a capture covers an svd step ({len(summaries)} captures: "
                          f"{[(s['reason'], s['steps']) for s in summaries]})")
    if not covering:
        return 1
    summary = covering[0]
    check(summary["activities"] == ["cpu", "cuda"], f"activities {summary['activities']}")
    device_top = [op["name"] for op in summary["top_device"][:5]]
    check(bool(device_top), f"top operators by device time: {device_top}")
    svd_names = ("svd", "gesvd", "syevd", "gesdd")
    check(any(part in name.lower() for name in device_top for part in svd_names),
          "an svd operator or kernel among the top 5 by device time")
    trace = json.loads(gzip.decompress((run_dir / summary["trace_file"]).read_bytes()))
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    check(len(kernels) > 0, f"{len(kernels)} GPU kernel events in {summary['trace_file']} "
                            f"({summary['trace_bytes'] / 1024:.0f} KiB)")
    ratio = statistics.median(summary["step_ms"]) / summary["median_ms"] if summary["median_ms"] else None
    print(f"captured steps {summary['step_ms']} ms against the rank's median {summary['median_ms']} ms "
          f"(x{ratio:.2f} median, the svd step included); profiler start "
          f"{summary['limits'].get('start_s')} s, stop {summary['limits'].get('stop_s')} s; "
          f"export {summary['export_s']} s off the training thread"
          if ratio else "no median to compare against")
    print("FAILED: " + "; ".join(failures) if failures else "all deep-capture CUDA checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
