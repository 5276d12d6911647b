"""Prove the CUDA paths on a real GPU: CUDA-event timing, per-step peak memory, h2d spans, no sync.

    python benchmarks/gpu_check.py [--out DIR]

Runs a small CUDA training loop under ``traceml.init()`` in a child process (with
``torch.cuda.synchronize`` and ``Event.synchronize`` counted), reads the local copy back
and checks it, then times bare against traced GPU steps. Prints every check and exits
non-zero if one fails. Needs a CUDA device; the CPU test suite covers the same logic
through a fake clock (tests/capture/test_recorder.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS = 60
BIG_STEP = 30  # allocates an extra GiB inside the step: its peak must stand out
HEAVY_STEP = 40  # GPU-heavy forward: GPU time far above the CPU launch time
GIB = 1 << 30
BATCH = (256, 1024)


def count_synchronize_calls(torch) -> dict[str, int]:
    """Wrap every CUDA synchronize entry point to count its calls; returns the live counts."""
    sync_calls = {"torch.cuda.synchronize": 0, "Event.synchronize": 0, "Stream.synchronize": 0}

    def counting(name: str, original):
        def wrapper(*args, **kwargs):
            sync_calls[name] += 1
            return original(*args, **kwargs)
        return wrapper

    torch.cuda.synchronize = counting("torch.cuda.synchronize", torch.cuda.synchronize)
    torch.cuda.Event.synchronize = counting("Event.synchronize", torch.cuda.Event.synchronize)
    torch.cuda.Stream.synchronize = counting("Stream.synchronize", torch.cuda.Stream.synchronize)
    return sync_calls


def train(traced: bool, steps: int, report: Path | None) -> None:
    """The loop, in a child process. Writes timings (and sync counts) to ``report``."""
    import torch
    from torch import nn

    sync_calls = count_synchronize_calls(torch)
    if traced:
        import traceml_otel as traceml

        assert traceml.init(mode="auto", strict=True)
    torch.manual_seed(0)
    device = os.environ.get("GPU_CHECK_DEVICE", "cuda")  # "cpu" only for a dry run of this script
    model = _net().to(device)
    heavy = torch.randn(8192, 8192, device=device) if device == "cuda" else torch.randn(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = steps * BATCH[0]
    data = torch.utils.data.TensorDataset(torch.randn(rows, BATCH[1]), torch.randn(rows, 1024))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH[0], pin_memory=True)
    if device == "cuda":  # first big matmul: cuBLAS set-up and allocations happen here, not in a step
        (heavy @ heavy @ heavy).mean()
        torch.cuda.synchronize()
    durations = []
    for step, (x, y) in enumerate(loader):
        started = time.perf_counter_ns()
        context = traceml.trace_step(model) if traced else _null()
        with context:
            x = x.to(device, non_blocking=True)
            y = y.cuda(non_blocking=True) if device == "cuda" else y
            optimizer.zero_grad(set_to_none=True)
            model.heavy = heavy if step == HEAVY_STEP else None
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if step == BIG_STEP and device == "cuda":
                extra = torch.empty(GIB, dtype=torch.uint8, device=device)
                extra.fill_(1)
                del extra
        durations.append(time.perf_counter_ns() - started)
    counted = dict(sync_calls)
    if traced:
        traceml.shutdown()
    if device == "cuda":
        torch.cuda.synchronize()
    if report is not None:
        report.write_text(json.dumps({"durations_ns": durations, "sync_calls_during_training": counted}))


def _net():
    import torch
    from torch import nn

    class Net(nn.Module):
        """An MLP whose forward can be made GPU-heavy for one step."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
            self.heavy: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.body(x)
            if self.heavy is not None:
                out = out + (self.heavy @ self.heavy @ self.heavy).mean()
            return out

    return Net()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> bool:
        return False


def _child(traced: bool, steps: int, report: Path, env: dict[str, str]) -> dict:
    command = [sys.executable, __file__, "--child", "traced" if traced else "bare", str(steps), str(report)]
    subprocess.run(command, env=env, check=True, timeout=300)
    return json.loads(report.read_text())


def _load_spans(run_dir: Path) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.local_copy_reader import read_run

    return [vars(span) for span in read_run(run_dir)]


def check_spans(run_dir: Path, device_total: int) -> list[tuple[str, bool, str]]:
    """The checks on what the traced run wrote."""
    spans = _load_spans(run_dir)
    steps = {s["attributes"]["traceml.step.number"]: s for s in spans if s["name"] == "traceml.step"}
    children: dict[int, list[dict]] = {}
    for span in spans:
        if span["name"] != "traceml.step":
            children.setdefault(span["attributes"]["traceml.step.number"], []).append(span)
    results = []

    def check(name: str, ok: bool, detail: str) -> None:
        results.append((name, bool(ok), detail))

    check("every step exported", sorted(steps) == list(range(STEPS)), f"{len(steps)} step spans")
    gpu_steps = [s for s in steps.values() if s["attributes"].get("traceml.clock") == "gpu"]
    check("steps on the GPU clock", len(gpu_steps) == len(steps), f"{len(gpu_steps)}/{len(steps)} clock=gpu")
    check("step GPU durations > 0",
          all(s["attributes"].get("traceml.step.gpu_duration", 0) > 0 for s in steps.values()), "")
    check("input wait on the GPU clock",
          all("traceml.input_wait.gpu_duration" in s["attributes"] for s in steps.values()), "")
    phase_names = {p["attributes"]["traceml.phase.name"] for ps in children.values() for p in ps}
    check("all phases present", phase_names == {"forward", "backward", "optimizer", "h2d"},
          str(sorted(phase_names)))
    h2d = [p for ps in children.values() for p in ps if p["attributes"]["traceml.phase.name"] == "h2d"]
    expected_bytes = {BATCH[0] * BATCH[1] * 4, BATCH[0] * 1024 * 4}
    check("two h2d copies per step (.to and .cuda)", len(h2d) == 2 * STEPS, f"{len(h2d)} h2d spans")
    check("h2d bytes", {p["attributes"]["traceml.h2d.bytes"] for p in h2d} <= expected_bytes,
          str(sorted({p["attributes"]["traceml.h2d.bytes"] for p in h2d})))
    check("phase GPU durations present",
          all("traceml.phase.gpu_duration" in p["attributes"] for ps in children.values() for p in ps), "")
    inside = all(
        steps[n]["start_ns"] <= p["start_ns"] <= p["end_ns"] <= steps[n]["end_ns"]
        for n, ps in children.items() for p in ps
    )
    check("children inside the step on the GPU timeline", inside, "")
    heavy = next(p for p in children[HEAVY_STEP] if p["attributes"]["traceml.phase.name"] == "forward")
    gpu_s = heavy["attributes"].get("traceml.phase.gpu_duration", 0.0)
    cpu_s = heavy["attributes"]["traceml.phase.cpu_duration"]
    # Informational: whether the CPU returned before the GPU finished depends on the host's
    # launch queue, not on us (on the H200 host the CPU waited out this forward both traced and bare).
    print(f"INFO  heavy forward: gpu {gpu_s * 1e3:.2f} ms, cpu {cpu_s * 1e3:.3f} ms (both clocks recorded)")
    peaks = {n: s["attributes"].get("traceml.cuda.memory.peak_allocated", 0) for n, s in steps.items()}
    reserved = {n: s["attributes"].get("traceml.cuda.memory.peak_reserved", 0) for n, s in steps.items()}
    check("memory peaks on every step", all(peaks.values()) and all(reserved.values()), "")
    check("reserved >= allocated", all(reserved[n] >= peaks[n] for n in peaks), "")
    before = statistics.median(peaks[n] for n in (BIG_STEP - 2, BIG_STEP - 1))
    after = max(peaks[n] for n in (BIG_STEP + 1, BIG_STEP + 2, BIG_STEP + 3))
    check("per-step peak reset (the 1 GiB step stands out, later steps drop back)",
          peaks[BIG_STEP] - before >= 0.9 * GIB and peaks[BIG_STEP] - after >= 0.9 * GIB,
          f"step {BIG_STEP}: {peaks[BIG_STEP] / GIB:.2f} GiB; "
          f"before {before / GIB:.2f}, after {after / GIB:.2f}")
    totals = {s["attributes"].get("traceml.cuda.memory.total") for s in steps.values()}
    check("device total memory", totals == {device_total}, str(totals))
    return results


def microbenchmarks() -> dict[str, float]:
    """Microseconds per call of each CUDA-side operation on the training thread."""
    import torch

    from traceml_otel.capture.device_clock import CudaEventClock

    clock = CudaEventClock()
    x = torch.randn(1024, 1024, device="cuda")
    x @ x
    clock.reset_peak_memory()  # resolves the device, as the first step does

    def per_call(fn, n: int = 2000) -> float:
        started = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - started) / n / 1000

    from traceml_otel.capture.hooks import HostToDevicePatch
    from traceml_otel.capture.recorder import StepRecorder

    class Discard:
        def send_steps(self, rows: list) -> None:
            pass

    recorder = StepRecorder(Discard(), clock, flush_steps=64)

    def empty_step() -> None:
        recorder.begin_step()
        recorder.end_step()

    def one_phase_step() -> None:
        recorder.begin_step()
        recorder.phase_end("forward", recorder.phase_begin())
        recorder.end_step()

    marks = []
    bare_to = per_call(lambda: x.to(torch.float32))
    patch = HostToDevicePatch(recorder)
    patch.install()
    recorder.begin_step()
    patched_to = per_call(lambda: x.to(torch.float32))
    recorder.end_step()
    patch.uninstall()
    results = {
        "recorder: empty step (begin+end)": per_call(empty_step),
        "recorder: step with one phase": per_call(one_phase_step),
        "Tensor.to on a CUDA tensor, bare": bare_to,
        "Tensor.to on a CUDA tensor, h2d patch in a step": patched_to,
        "clock.mark (pooled event record)": per_call(lambda: marks.append(clock.mark())),
        "clock.reset_peak_memory": per_call(clock.reset_peak_memory),
        "clock.peak_memory (nested dict)": per_call(clock.peak_memory),
        "max_memory_allocated + max_memory_reserved": per_call(
            lambda: (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())),
        "event.query": per_call(lambda: marks[-1].query()),
    }
    heavy = torch.randn(8192, 8192, device="cuda")
    heavy @ heavy
    torch.cuda.synchronize()
    started = time.perf_counter_ns()
    heavy @ heavy
    launch_us = (time.perf_counter_ns() - started) / 1000
    torch.cuda.synchronize()
    results["CPU time to launch an 8192^3 matmul (large = blocking launches)"] = launch_us
    return results


_FLIGHT_RECORDER_CHILD = """
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from traceml_otel.capture.flight_recorder import dump_flight_recorder
backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend, rank=0, world_size=1)
device = "cuda" if backend == "nccl" else "cpu"
dist.all_reduce(torch.ones(1024, device=device))
if device == "cuda":
    torch.cuda.synchronize()
said = dump_flight_recorder(Path(sys.argv[1]), 0)
dump = json.loads((Path(sys.argv[1]) / "rank-0.flight-recorder.json").read_text())
print(json.dumps({"said": said, "backend": backend,
                  "ops": [e.get("profiling_name") for e in dump.get("entries", [])]}))
"""


def check_flight_recorder(out: Path) -> tuple[str, bool, str]:
    """PyTorch's flight recorder, dumped as the hang watchdog does (NCCL on a GPU, gloo in a dry run)."""
    from traceml_otel.launch.single import free_port

    env = {**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "64", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    result = subprocess.run([sys.executable, "-c", _FLIGHT_RECORDER_CHILD, str(out)], env=env,
                            capture_output=True, text=True, timeout=300)
    try:
        seen = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return ("flight recorder dumped on request", False, result.stderr[-500:])
    ok = any("all_reduce" in (op or "") for op in seen["ops"])
    detail = f"{seen['backend']}: {seen['said']}; ops {seen['ops'][:3]}"
    return ("flight recorder dumped on request", ok, detail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and os.environ.get("GPU_CHECK_DEVICE") != "cpu":
        print("no CUDA device: nothing to prove here (the CPU suite covers the logic)")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = torch.cuda.is_available()
    device_total = torch.cuda.get_device_properties(0).total_memory if on_gpu else 0
    device_name = torch.cuda.get_device_name(0) if on_gpu else "cpu (dry run)"
    print(f"device: {device_name}, torch {torch.__version__}, "
          f"CUDA_LAUNCH_BLOCKING={os.environ.get('CUDA_LAUNCH_BLOCKING')!r}", flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(out / "runs"), TRACEML_RUN_ID="gpu-check")
    traced = _child(True, STEPS, out / "traced.json", env)
    results = check_spans(out / "runs" / "gpu-check", device_total)
    syncs = traced["sync_calls_during_training"]
    bare_syncs = _child(False, STEPS, out / "bare-syncs.json", env)["sync_calls_during_training"]
    results.append(("no synchronize added during training", sum(syncs.values()) <= sum(bare_syncs.values()),
                    f"traced {syncs}, bare {bare_syncs}"))
    results.append(check_flight_recorder(out))
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
    overhead = []
    env["TRACEML_RUN_ID"] = "gpu-overhead"
    for _ in range(3):
        bare = statistics.median(_child(False, 200, out / "bare.json", env)["durations_ns"][20:])
        traced_ns = statistics.median(_child(True, 200, out / "t.json", env)["durations_ns"][20:])
        overhead.append((bare, traced_ns))
    bare = statistics.median(b for b, _ in overhead)
    traced_ns = statistics.median(t for _, t in overhead)
    print(f"overhead: bare {bare / 1e6:.3f} ms/step, traced {traced_ns / 1e6:.3f} ms/step, "
          f"added {(traced_ns - bare) / 1e3:+.1f} us ({(traced_ns / bare - 1) * 100:+.2f} %)"
          "  [CPU-side step time]")
    micro = microbenchmarks() if on_gpu else {}
    for name, micros in micro.items():
        print(f"  {name:<45} {micros:7.2f} us/call")
    summary = {"checks": results, "overhead_ns": overhead, "device": device_name, "micro_us": micro}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        train(sys.argv[2] == "traced", int(sys.argv[3]), Path(sys.argv[4]))
    else:
        sys.exit(main())
