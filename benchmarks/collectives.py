"""What collective timing adds per step: a 2-rank gloo DDP job, collective capture on against off.

    .venv/bin/python benchmarks/collectives.py [--rounds 20] [--block-steps 50] [--hidden 256]
    .venv/bin/python benchmarks/collectives.py --micro     # one process: the hook's own cost

Launches two ranks with ``torch.distributed.run`` (CPU, gloo). Each rank runs ``init()`` and then
alternates, in lockstep, steps of the same traced loop (``trace_step``, forward, backward,
optimizer, plus one explicit ``dist.all_reduce`` of the loss inside the step):

- *off*: a DDP model with DDP's built-in all-reduce and the ``torch.distributed`` patch removed;
- *on*: an identical DDP model whose gradient sync goes through traceml's timing hook, with the
  patch installed.

Everything else (the other hooks, the emitter) is the same in both, so the difference is the cost
of collective timing alone, in the training loop and in the emitter (which builds the extra
``traceml.collective`` spans). Off and on steps alternate one by one (the switch happens outside
the timed step) and each on step is paired with the off step before it, so drift of the machine
cancels out. Prints, per rank, the median off step time and the median added time per step.

Two ranks sharing two busy cores wait for each other at every all-reduce, so on small VMs this
end-to-end figure is noisy; ``--micro`` measures the hook's own cost in one process (gloo, world
size 1): a backward with DDP's built-in all-reduce against the same backward through the timing
hook, and an explicit ``dist.all_reduce`` with and without the patch.
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


def worker(rounds: int, block_steps: int, hidden: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import traceml_otel as traceml
    from traceml_otel.capture.session import TrainingSession, current

    torch.set_num_threads(1)
    assert traceml.init(mode="auto", strict=True)
    dist.init_process_group("gloo")
    session = current()
    assert isinstance(session, TrainingSession)
    timing = session.collectives  # the benchmark switches the torch.distributed patch itself
    assert timing is not None

    def make() -> nn.Module:
        torch.manual_seed(0)
        return DistributedDataParallel(nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        ))

    timing.uninstall()  # DDP models built while timing is installed get its hook at construction
    plain = make()
    timing.install()
    timed = make()
    assert not plain._comm_hooks and timed._comm_hooks  # off: DDP's built-in; on: the timing hook
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, hidden), torch.randint(0, 10, (64,))

    def block(model: nn.Module) -> tuple[float, float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        wall, cpu = [], []
        for _ in range(block_steps):
            started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
            with traceml.trace_step(model):
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                dist.all_reduce(loss.detach())
            wall.append(time.perf_counter_ns() - started)
            cpu.append(time.thread_time_ns() - cpu_started)
        return statistics.median(wall), statistics.median(cpu)

    optimizers = {id(m): torch.optim.SGD(m.parameters(), lr=1e-3) for m in (plain, timed)}

    def one_step(model: nn.Module) -> tuple[int, int]:
        optimizer = optimizers[id(model)]
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            dist.all_reduce(loss.detach())
        return time.perf_counter_ns() - started, time.thread_time_ns() - cpu_started

    block(plain), block(timed)  # warm-up: DDP rebuilds its buckets after the first iterations
    pairs = []
    for _ in range(rounds):
        for _ in range(block_steps):
            timing.uninstall()
            off = one_step(plain)
            timing.install()
            on = one_step(timed)
            pairs.append((off, on))
        traceml.flush()
        dist.barrier()
        time.sleep(0.2)  # the emitters drain this round's steps before the next round
    traceml.shutdown()
    result = Path(os.environ["COLLECTIVES_BENCH_OUT"]) / f"rank-{dist.get_rank()}.json"
    result.write_text(json.dumps({  # one file per rank: their stdout lines would interleave
        "rank": dist.get_rank(),
        "off_ns": statistics.median(o[0] for o, _ in pairs),
        "added_ns": statistics.median(n[0] - o[0] for o, n in pairs),
        "added_cpu_ns": statistics.median(n[1] - o[1] for o, n in pairs),
        "quartiles_ns": statistics.quantiles([n[0] - o[0] for o, n in pairs], n=4),
    }))
    dist.destroy_process_group()


def micro(repeats: int = 15, steps: int = 300) -> None:
    """The hook's own cost in one process (gloo, world size 1), against the same loop without it."""
    import statistics
    import tempfile

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from traceml_otel.capture.collectives import CollectiveTiming
    from traceml_otel.capture.recorder import StepRecorder

    class Discard:
        def send_steps(self, rows: list) -> None:
            pass

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    recorder = StepRecorder(Discard())
    timing = CollectiveTiming(recorder, print)
    timing.install()

    def model() -> nn.Module:
        torch.manual_seed(0)
        return DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))

    timing.uninstall()  # DDP models built while timing is installed get its hook at construction
    builtin = model()
    timing.install()
    timed = model()
    assert not builtin._comm_hooks and timed._comm_hooks
    x, one = torch.randn(8, 64), torch.ones(1)

    def per_step(work) -> float:
        times = []
        for _ in range(steps):
            recorder.begin_step()
            started = time.perf_counter_ns()
            work()
            times.append(time.perf_counter_ns() - started)
            recorder.end_step()
        return statistics.median(times)

    def backward(m):
        return lambda: m(x).sum().backward()

    per_step(backward(builtin)), per_step(backward(timed))
    hook = [(per_step(backward(builtin)), per_step(backward(timed))) for _ in range(repeats)]
    calls = []
    for _ in range(repeats):
        timing.uninstall()
        off = per_step(lambda: dist.all_reduce(one))
        timing.install()
        calls.append((off, per_step(lambda: dist.all_reduce(one))))
    dist.destroy_process_group()
    for label, pairs in (("backward, DDP (1 bucket)", hook), ("explicit dist.all_reduce", calls)):
        off = statistics.median(o for o, _ in pairs)
        added = statistics.median(n - o for o, n in pairs)
        print(f"{label:<26} off {off / 1000:7.1f} us   timing adds {added / 1000:+6.1f} us "
              f"({added / off * 100:+.1f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="off/on block pairs")
    parser.add_argument("--block-steps", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=256, help="MLP width (256: ~1-2 ms steps here)")
    parser.add_argument("--micro", action="store_true", help="one process: the timing hook's own cost")
    args = parser.parse_args()
    if args.micro:
        micro()
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env["TRACEML_RUNS_DIR"] = tempfile.mkdtemp(prefix="traceml-bench-collectives-")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, "--worker",
               str(args.rounds), str(args.block_steps), str(args.hidden)]
    out = Path(tempfile.mkdtemp(prefix="traceml-bench-collectives-out-"))
    env["COLLECTIVES_BENCH_OUT"] = str(out)
    subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=True)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, 2 gloo ranks; median over {args.rounds} "
          f"rounds of {args.block_steps} adjacent off/on step pairs (DDP + one explicit all_reduce per step)")
    for path in sorted(out.glob("rank-*.json")):
        r = json.loads(path.read_text())
        low, _, high = r["quartiles_ns"]
        print(f"rank {r['rank']}: off {r['off_ns'] / 1e6:6.3f} ms/step   collective timing adds "
              f"{r['added_ns'] / 1000:+6.1f} us/step ({r['added_ns'] / r['off_ns'] * 100:+.2f} %, quartiles "
              f"{low / 1000:+.0f}..{high / 1000:+.0f} us)   "
              f"training-thread CPU {r['added_cpu_ns'] / 1000:+6.1f} us")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
