"""Per-step overhead of traceml-otel against a bare loop, measured in the same run.

    .venv/bin/python benchmarks/overhead.py            # ~1 ms and ~10 ms CPU steps, local copy only
    .venv/bin/python benchmarks/overhead.py --otlp     # also with an OTLP endpoint (a real rotel collector)

Step times on these small VMs differ by 10-30 % from one process to the next (placement,
allocator state), far more than the effect measured here. So bare and instrumented steps
are compared inside one process: after ``init()``, blocks alternate between the bare loop
(every hook uninstalled, no ``trace_step``) and the instrumented loop (hooks installed,
``trace_step``, every step exported, no sampling). After each instrumented block the
benchmark flushes and waits for the emitter to go idle, so its work is not billed to the
next bare block. Torch runs on one thread; the emitter process has the other core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIZES = {"1ms": 192, "10ms": 1024}
"""Hidden width of the MLP for each target step time (on these 2-core machines)."""


def traced_setup(hidden: int) -> tuple[Any, list[Any], Any, Any, Iterator[Any]]:
    """``init()`` in auto mode, then the benchmark's MLP: (model, the hooks that the bare blocks
    uninstall, optimizer, loss, an endless batch iterator). Shared with ``in_situ_cost.py``."""
    import torch
    from torch import nn

    import traceml_otel as traceml
    from traceml_otel.capture.session import TrainingSession, current

    torch.set_num_threads(1)
    torch.manual_seed(0)
    assert traceml.init(mode="auto", strict=True)
    telemetry = current()  # the benchmark switches hooks off for bare blocks
    assert isinstance(telemetry, TrainingSession)
    hooks = [*telemetry.installed, telemetry.forward]
    data = torch.utils.data.TensorDataset(torch.randn(256, hidden), torch.randint(0, 10, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=False)
    model = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def batches() -> Iterator[Any]:
        while True:
            yield from loader

    return model, hooks, optimizer, nn.CrossEntropyLoss(), batches()


def worker(hidden: int, block_steps: int, rounds: int, drain: bool = True) -> None:
    """Alternate bare and instrumented blocks; print both medians (ns) as JSON."""
    import traceml_otel as traceml

    model, hooks, optimizer, loss_fn, source = traced_setup(hidden)

    def block(traced: bool) -> tuple[float, float]:
        """Median wall and training-thread CPU time per step of one block."""
        wall, cpu = [], []
        for _ in range(block_steps):
            started = time.perf_counter_ns()
            cpu_started = time.thread_time_ns()
            x, y = next(source)
            if traced:
                with traceml.trace_step(model):
                    optimizer.zero_grad(set_to_none=True)
                    loss_fn(model(x), y).backward()
                    optimizer.step()
            else:
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                optimizer.step()
            wall.append(time.perf_counter_ns() - started)
            cpu.append(time.thread_time_ns() - cpu_started)
        return statistics.median(wall), statistics.median(cpu)

    time.sleep(3.0)  # let the emitter process finish starting (imports) before measuring
    pairs = []
    for _ in range(rounds):
        for hook in hooks:
            hook.uninstall()
        bare = block(False)
        for hook in hooks:
            hook.install()
        traced = block(True)
        pairs.append((bare, traced))
        if drain:
            traceml.flush()
            time.sleep(0.2)  # the emitter drains this block's steps before the next bare block
    traceml.shutdown()
    # Adjacent blocks are paired so that slow drift of the machine cancels out.
    print(json.dumps({
        "bare_ns": statistics.median(b[0] for b, _ in pairs),
        "added_wall_ns": statistics.median(t[0] - b[0] for b, t in pairs),
        "added_cpu_ns": statistics.median(t[1] - b[1] for b, t in pairs),
        "added_wall_quartiles_ns": statistics.quantiles([t[0] - b[0] for b, t in pairs], n=4),
    }))


def _run_worker(hidden: int, block_steps: int, rounds: int, env: dict[str, str],
                drain: bool = True) -> dict[str, float]:
    command = [sys.executable, __file__, "--worker", str(hidden), str(block_steps), str(rounds),
               "drain" if drain else "overlap"]
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=900)
    return json.loads(output.stdout.strip().splitlines()[-1])


def _start_rotel() -> tuple[subprocess.Popen[bytes], str]:
    import rotel

    agent = Path(rotel.__file__).parent / "rotel-agent"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="rotel-bench-")
    process = subprocess.Popen(
        [str(agent), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{port}", "--otlp-http-endpoint",
         "127.0.0.1:0", "--exporter", "blackhole", "--pid-file", f"{workdir}/pid", "--log-file",
         f"{workdir}/log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as client:
            if client.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("rotel-agent did not start")


def measure(label: str, hidden: int, block_steps: int, rounds: int, processes: int,
            env: dict[str, str], drain: bool = True) -> None:
    for _ in range(processes):
        result = _run_worker(hidden, block_steps, rounds, env, drain)
        bare, added, cpu = result["bare_ns"], result["added_wall_ns"], result["added_cpu_ns"]
        low, _, high = result["added_wall_quartiles_ns"]
        print(f"{label:<34} bare {bare / 1e6:7.3f} ms/step   added {added / 1000:+7.1f} us/step "
              f"({added / bare * 100:+.2f} %, quartiles {low / 1000:+.0f}..{high / 1000:+.0f} us)   "
              f"training-thread CPU {cpu / 1000:+7.1f} us/step", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--otlp", action="store_true", help="also measure with an OTLP endpoint (rotel)")
    parser.add_argument("--rounds", type=int, default=30, help="bare/instrumented block pairs per process")
    parser.add_argument("--processes", type=int, default=2, help="processes per configuration")
    parser.add_argument("--hidden", type=int, default=None,
                        help="one step size: this hidden width instead of the ~1 ms and ~10 ms ones")
    parser.add_argument("--block-steps", type=int, default=None,
                        help="steps per block (default 100; 20 at 10 ms)")
    parser.add_argument("--overlap", action="store_true",
                        help="no drain between blocks: the emitter works while the traced block runs (its "
                             "last batch spills into the next bare block), so its effect on the training "
                             "thread is counted too; use blocks of 1,000+ steps")
    parser.add_argument("--hogs", type=int, default=0,
                        help="busy-loop processes running beside the benchmark")
    args = parser.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="traceml-bench-")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    base_env["TRACEML_RUNS_DIR"] = runs_dir
    configurations = [("local copy only", base_env)]
    rotel = None
    if args.otlp:
        rotel, endpoint = _start_rotel()
        configurations.append(("OTLP gRPC to collector", {**base_env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                                            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; median step time of "
          f"{args.rounds} adjacent bare/instrumented block pairs, one line per process")
    sizes = SIZES if args.hidden is None else {f"hidden {args.hidden}": args.hidden}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        for size, hidden in sizes.items():
            block_steps = args.block_steps or (20 if size == "10ms" else 100)
            for name, env in configurations:
                measure(f"~{size} steps, {name}", hidden, block_steps, args.rounds, args.processes, env,
                        drain=not args.overlap)
    finally:
        for hog in hogs:
            hog.kill()
        if rotel is not None:
            rotel.kill()
        shutil.rmtree(runs_dir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), drain=sys.argv[5] == "drain")
    else:
        main()
