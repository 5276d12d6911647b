"""Per-step overhead of traceml-otel against a bare loop, measured in the same run.

    .venv/bin/python benchmarks/overhead.py            # ~1 ms and ~10 ms CPU steps, local copy only
    .venv/bin/python benchmarks/overhead.py --otlp     # also with an OTLP endpoint (a real rotel collector)

Each configuration runs in its own fresh process (init() patches globally), and bare and
instrumented processes alternate in rounds so machine drift hits both alike. A process
trains an MLP on in-memory data with torch on one thread; every step is exported, no
sampling. Reported: median step time per variant, microseconds added per step, and the
ratio to the bare loop.
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
from pathlib import Path

SIZES = {"1ms": 192, "10ms": 1024}
"""Hidden width of the MLP for each target step time (on these 2-core machines)."""


def worker(hidden: int, steps: int, instrumented: bool) -> None:
    """Train ``steps`` steps and print the median step time (ns) as JSON."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if instrumented:
        import traceml_otel as traceml

        assert traceml.init(mode="auto", strict=True)
    data = torch.utils.data.TensorDataset(torch.randn(256, hidden), torch.randint(0, 10, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=False)
    model = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def one_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    times: list[int] = []
    done = 0
    while done < steps:
        iterator = iter(loader)
        while done < steps:
            started = time.perf_counter_ns()
            try:
                x, y = next(iterator)
            except StopIteration:
                break
            if instrumented:
                with traceml.trace_step(model):
                    one_step(x, y)
            else:
                one_step(x, y)
            times.append(time.perf_counter_ns() - started)
            done += 1
    warm = times[len(times) // 10:]
    print(json.dumps({"median_ns": statistics.median(warm)}))


def _run_worker(hidden: int, steps: int, instrumented: bool, env: dict[str, str]) -> float:
    command = [sys.executable, __file__, "--worker", str(hidden), str(steps), str(int(instrumented))]
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(output.stdout.strip().splitlines()[-1])["median_ns"]


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


def measure(label: str, hidden: int, steps: int, rounds: int, env: dict[str, str]) -> None:
    bare, traced = [], []
    for _ in range(rounds):
        bare.append(_run_worker(hidden, steps, False, env))
        traced.append(_run_worker(hidden, steps, True, env))
    bare_ns, traced_ns = statistics.median(bare), statistics.median(traced)
    added_us = (traced_ns - bare_ns) / 1000
    ratio = traced_ns / bare_ns
    print(f"{label:<34} bare {bare_ns / 1e6:8.3f} ms   traced {traced_ns / 1e6:8.3f} ms   "
          f"added {added_us:+8.1f} us/step   ratio {ratio:.4f} ({(ratio - 1) * 100:+.2f} %)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--otlp", action="store_true", help="also measure with an OTLP endpoint (rotel)")
    parser.add_argument("--steps", type=int, default=0, help="steps per process (default: ~3 s of work)")
    parser.add_argument("--rounds", type=int, default=3, help="bare/traced process pairs per configuration")
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
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; median step time per process, "
          f"median over {args.rounds} process pairs")
    try:
        for size, hidden in SIZES.items():
            steps = args.steps or (3000 if size == "1ms" else 300)
            for name, env in configurations:
                measure(f"~{size} steps, {name}", hidden, steps, args.rounds, env)
    finally:
        if rotel is not None:
            rotel.kill()
        shutil.rmtree(runs_dir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4])))
    else:
        main()
