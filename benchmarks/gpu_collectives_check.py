"""Prove collective timing on a real GPU: DDP over NCCL (world size 1), event-timed, no added sync.

    python benchmarks/gpu_collectives_check.py [--out DIR]
    GPU_CHECK_DEVICE=cpu python benchmarks/gpu_collectives_check.py   # dry run of this script (gloo)

Runs a small DDP training loop under ``traceml.init()`` in a child process: one NCCL process group
of world size 1 on GPU 0, with ``torch.cuda.synchronize``, ``Event.synchronize`` and
``Stream.synchronize`` counted. Each step also calls a blocking ``dist.all_reduce`` and an
``async_op=True`` one on CUDA tensors. It then reads the local copy back and checks that every step
carries the DDP gradient all-reduce with CUDA-event (GPU) durations, bytes equal to the gradient
size and an exposed GPU time, that the blocking call is fully exposed and the async one has no
exposed time, and that tracing added no synchronize call (bare run of the same loop as reference).
Prints every check and exits non-zero if one fails. The CPU suite covers the same logic with gloo
and a fake event clock (tests/capture/test_collectives.py, tests/capture/test_recorder.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 30


def train(traced: bool, report: Path) -> None:
    """The loop, in a child process; writes the synchronize counts to ``report``."""
    import torch
    import torch.distributed as dist
    from gpu_check import count_synchronize_calls  # this folder is on sys.path: run as a script
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    device = os.environ.get("GPU_CHECK_DEVICE", "cuda")
    on_gpu = device == "cuda"
    sync_calls = dict.fromkeys(("torch.cuda.synchronize", "Event.synchronize", "Stream.synchronize"), 0)
    if on_gpu:
        sync_calls = count_synchronize_calls(torch)
        torch.cuda.set_device(0)
    if traced:
        import traceml_otel as traceml

        assert traceml.init(mode="auto", strict=True)
    store = tempfile.mkdtemp(prefix="gpu-collectives-")
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{store}/store", rank=0,
                            world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(device),
        device_ids=[0] if on_gpu else None,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(256, 1024, device=device), torch.randn(256, 1024, device=device)
    counter = torch.ones(64, device=device)
    for _ in range(STEPS):
        context = traceml.trace_step(model) if traced else _null()
        with context:
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            dist.all_reduce(loss.detach())
            work = dist.all_reduce(counter, async_op=True)
            work.wait()
    counted = dict(sync_calls)
    if traced:
        traceml.shutdown()
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    dist.destroy_process_group()
    report.write_text(json.dumps({"sync_calls_during_training": counted, "gradient_bytes": gradient_bytes}))


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> bool:
        return False


def _child(traced: bool, report: Path, env: dict[str, str]) -> dict:
    command = [sys.executable, __file__, "--child", "traced" if traced else "bare", str(report)]
    subprocess.run(command, env=env, check=True, timeout=300)
    return json.loads(report.read_text())


def check_spans(run_dir: Path, gradient_bytes: int, on_gpu: bool) -> list[tuple[str, bool, str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.local_copy_reader import read_run

    spans = read_run(run_dir)
    steps = [s.attributes for s in spans if s.name == "traceml.step"]
    groups: dict[tuple[int, str, str], dict] = {}
    for span in spans:
        if span.name == "traceml.collective":
            a = span.attributes
            key = (a["traceml.step.number"], a["traceml.collective.source"], a["traceml.collective.kind"])
            groups[key] = a
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, bool(ok), detail))

    ddp = [groups.get((n, "ddp", "all_reduce")) for n in range(STEPS)]
    api = [groups.get((n, "api", "all_reduce")) for n in range(STEPS)]
    check("every step exported", len(steps) == STEPS, f"{len(steps)} step spans")
    check("DDP gradient all-reduce on every step", all(ddp), f"{sum(1 for d in ddp if d)}/{STEPS}")
    check("DDP bytes = gradient size", {d["traceml.collective.bytes"] for d in ddp if d} == {gradient_bytes},
          f"{sorted({d['traceml.collective.bytes'] for d in ddp if d})} vs {gradient_bytes}")
    check("explicit all_reduce calls on every step (one blocking, one async)",
          all(a and a["traceml.collective.calls"] == 2 for a in api))
    if on_gpu:
        gpu = [d.get("traceml.collective.gpu_duration", 0) for d in ddp if d]
        check("DDP all-reduce timed by CUDA events (gpu_duration > 0)", gpu and min(gpu) > 0,
              f"median {sorted(gpu)[len(gpu) // 2] * 1e6:.0f} us" if gpu else "")
        check("DDP exposed GPU time present and <= total", all(
            0 <= d.get("traceml.collective.exposed.gpu_duration", -1) <= d["traceml.collective.gpu_duration"]
            for d in ddp if d
        ))
        check("explicit calls timed by CUDA events", all(a and a.get("traceml.collective.gpu_duration", 0) > 0
                                                         for a in api))
        check("async call makes the exposed time unknown (absent)",
              all(a and "traceml.collective.exposed.gpu_duration" not in a for a in api))
        check("steps on the GPU clock", all(s.get("traceml.clock") == "gpu" for s in steps))
        print(f"INFO  DDP all-reduce step 10: gpu {ddp[10]['traceml.collective.gpu_duration'] * 1e6:.0f} us, "
              f"cpu {ddp[10]['traceml.collective.cpu_duration'] * 1e6:.0f} us (CPU: hand-over to enqueue)")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-collectives-out"))
    args = parser.parse_args()
    import torch

    on_gpu = os.environ.get("GPU_CHECK_DEVICE", "cuda") == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("no CUDA device: nothing to prove here (GPU_CHECK_DEVICE=cpu runs the script on gloo)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(out / "runs"), TRACEML_RUN_ID="gpu-collectives")
    traced = _child(True, out / "traced.json", env)
    bare = _child(False, out / "bare.json", env)
    results = check_spans(out / "runs" / "gpu-collectives", traced["gradient_bytes"], on_gpu)
    syncs, bare_syncs = traced["sync_calls_during_training"], bare["sync_calls_during_training"]
    results.append(("no synchronize added during training", sum(syncs.values()) <= sum(bare_syncs.values()),
                    f"traced {syncs}, bare {bare_syncs}"))
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
    (out / "gpu_collectives_check.json").write_text(json.dumps({"checks": results}, indent=2))
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        train(sys.argv[2] == "traced", Path(sys.argv[3]))
    else:
        sys.exit(main())
