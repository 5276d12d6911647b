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
  then), divided by the steps. It moves with the machine's load too: the training thread's own CPU
  time per step grows when other processes share its cores and caches (``--control`` shows how much).

Scenarios: ``fast`` (~0.5 ms CPU steps), ``hogs`` (~2 ms steps while two busy-loop processes
compete for the CPUs). Printed: each pair's differences, then the median and the spread (min..max)
over the pairs, and the 1-minute load average at the start of every run.

``--tasks``: also each thread's CPU per step (the training process's threads by their Python name:
``trainer main`` is the training thread, ``trainer traceml-hang-watchdog`` the hang watchdog; the
emitter's and launcher's by process), the training process's garbage collections per 1,000 steps and
their time (``gc.callbacks``), and the median and spread of each one's on - off difference.
``--control``: an A/A run, telemetry off on both sides of every pair, so the printed spreads are the
noise floor the real pairs must be read against.
``--capture``: the "off" side keeps telemetry on with ``TRACEML_CAPTURE=0``: deep captures' cost while
none is taken (the poller thread, the emitter's triggers).
``--live``: the "off" side keeps telemetry on with ``TRACEML_LIVE=off`` (no launcher view, no
``rank-R.live.json``): the live view's own cost (with ``--control``, an A/A of that off side).
``--traced step|loader|no-model``: the "on" side turns on only a part of telemetry (the pieces of its
cost, one at a time; see ``TRACED_PARTS``).
``--otlp``: both sides point at a real rotel collector (OTLP/gRPC, blackhole exporter, started here;
its own CPU is not in the tree), so the "on" side exports every span (``TRACEML_OTLP_SPANS=all``) and
the metrics over OTLP, as a production run does; ``--otlp-spans sampled`` for the span budget.
``--floor``: the "on" side runs, with telemetry off, bare Python wrappers at the points telemetry
times (the loader's ``next()``, the model's class call, ``backward()``, the optimizer's ``step``, the
step block, a 256-row JSON frame written to ``/dev/null``): the least any design that times those
points from Python adds on this machine, to read telemetry's own pairs against.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINER = r'''
import gc, json, os, statistics, sys, threading, time
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


TRACED = os.environ.get("OVERHEAD_PAIRS_TRACED", "all")  # --traced: which part of telemetry is on
traceml.init(**{"step": {"mode": "manual"}, "loader": {"mode": "selective", "patch_dataloader": True}}.get(
    TRACED, {"mode": "auto"}))
torch.manual_seed(0)
torch.set_num_threads(1)
n = 256 * 32
data = TensorDataset(torch.randn(n, HIDDEN), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=32, shuffle=False)
model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()


if os.environ.get("OVERHEAD_PAIRS_FLOOR") == "1":
    # --floor: telemetry off, and in its place the least any Python-level design adds at the same
    # points: a bare wrapper on the loader's next(), the model's class call, backward() and the
    # optimizer's step, each two clock readings and an append, and a step block that keeps a row and
    # writes 256 rows at a time as one JSON frame (to /dev/null).
    from time import perf_counter_ns as clock
    from torch.utils.data import dataloader as loader_module
    try:
        from orjson import dumps
    except ImportError:
        def dumps(rows):
            return json.dumps(rows).encode()
    floor_rows, floor_step = [], [[]]
    devnull = os.open(os.devnull, os.O_WRONLY)

    def bare(original, name, to_step=True):
        def timed(*args, **kwargs):
            start = clock()
            out = original(*args, **kwargs)
            (floor_step[0] if to_step else floor_rows).append([name, start, clock()])
            return out
        return timed

    iterator = loader_module._BaseDataLoaderIter
    iterator.__next__ = bare(iterator.__next__, "fetch", False)
    nn.Sequential.__call__ = bare(nn.Module.__call__, "forward")
    torch.Tensor.backward = bare(torch.Tensor.backward, "backward")
    type(optimizer).step = bare(type(optimizer).step, "optimizer")

    class BareStep:
        def __enter__(self):
            self.start = clock()
            floor_step[0] = []

        def __exit__(self, *exc):
            floor_rows.append([self.start, clock(), floor_step[0]])
            if len(floor_rows) >= 256:
                os.write(devnull, dumps(floor_rows))
                floor_rows.clear()
            return False

    class traceml:  # noqa: N801 (the loop below calls traceml.trace_step)
        @staticmethod
        def trace_step(model=None):
            return BareStep()


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


def role(pid):
    """Which process of the tree: the launcher, this training process, or a child of it (the emitter)."""
    if pid == os.getpid():
        return "trainer"
    if pid == os.getppid():
        return "launcher"
    return "emitter"


def per_task():
    """CPU ns of each thread of the tree, as 'role thread' (this process's threads by Python name)."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    rows = {}
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                own = names.get(int(tid), "thread") if pid == os.getpid() else "thread"
                thread = "main" if int(tid) == pid else own
                label = f"{role(pid)} {thread}"
                rows[label] = rows.get(label, 0) + ns
        except OSError:
            pass
    return rows


gc_ns = [0, 0]  # collections, ns spent in them (the training process, measured steps only)
gc_started = [0]


def gc_watch(phase, info):
    if phase == "start":
        gc_started[0] = time.perf_counter_ns()
    else:
        gc_ns[0] += 1
        gc_ns[1] += time.perf_counter_ns() - gc_started[0]


calibration_weights = torch.randn(HIDDEN, HIDDEN)
calibration_batch = torch.randn(32, HIDDEN)
calibration_ns = []


def calibrate():
    """A fixed piece of work like a step's (matmuls, Python calls), outside any step: its thread CPU
    time says how fast the machine runs now. The measured loop runs it every 64 steps."""
    started = time.thread_time_ns()
    for _ in range(8):
        (calibration_batch @ calibration_weights).relu_().sum().item()
        sum(range(200))
    calibration_ns.append(time.thread_time_ns() - started)


def barrier():
    """With --concurrent: wait until the other run of the pair has also settled (both measure at once)."""
    folder = os.environ.get("OVERHEAD_PAIRS_BARRIER")
    if not folder:
        return
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)


walls = []
for step in range(WARMUP + STEPS):
    if step == WARMUP:  # the warm-up's steps are written and every process has finished starting
        settle()
        barrier()
        tasks_started = per_task()
        cpu_started = tree_cpu_ns(pids)
        gc.callbacks.append(gc_watch)
    if step >= WARMUP and step % 64 == 0:
        calibrate()
    started = time.perf_counter_ns()
    x, y = next(source)
    with traceml.trace_step(model if TRACED == "all" else None):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    if step >= WARMUP:
        walls.append(time.perf_counter_ns() - started)
gc.callbacks.remove(gc_watch)
previous = settle()  # the emitter writes the last batches after the loop
tasks = {name: (ns - tasks_started.get(name, 0)) / STEPS for name, ns in per_task().items()}
calibration_total = sum(calibration_ns)
tasks["trainer main"] -= calibration_total / STEPS  # the calibration is not the steps' work
result = {"median_ns": statistics.median(walls), "mean_ns": statistics.fmean(walls),
          "tree_cpu_ns": (previous - cpu_started - calibration_total) / STEPS, "processes": len(pids),
          "calibration_ns": statistics.median(calibration_ns),
          "tasks_ns": tasks, "gc_per_1000_steps": gc_ns[0] * 1000 / STEPS, "gc_ns": gc_ns[1] / STEPS}
with open(os.environ["OVERHEAD_PAIRS_OUT"], "w") as out:
    json.dump(result, out)
'''

TRACED_PARTS = {
    "all": "everything (init(mode='auto'), trace_step(model))",
    "step": "trace_step() alone (init(mode='manual'))",
    "loader": "trace_step() and the DataLoader patch (mode='selective')",
    "no-model": "auto mode without the model's forward (trace_step())",
}
"""--traced: the parts of telemetry the 'on' side runs (the pieces of its cost, one at a time)."""

LIVE_AB = False
"""--live: the 'off' side keeps telemetry on and turns the live view off (``TRACEML_LIVE=off``)."""
CAPTURE_AB = False
"""--capture: the 'off' side keeps telemetry on and turns deep captures off (``TRACEML_CAPTURE=0``)."""
OTLP: dict[str, str] = {}
"""--otlp: the OTLP settings both sides run with (the real collector's endpoint)."""

SCENARIOS = {"fast": (64, 0), "hogs": (640, 2)}
"""Hidden width and the number of CPU hogs: ~0.5 ms steps, and ~2 ms steps with two hogs on this 2-vCPU VM
(640: 512 gave 1.1-1.6 ms steps beside the hogs)."""


def _command(script: Path, telemetry: bool, steps: int, warmup: int, hidden: int, workdir: Path,
             out: Path, floor: bool = False, traced: str = "all") -> tuple[list[str], dict[str, str]]:
    out.unlink(missing_ok=True)
    env = {**os.environ, "OVERHEAD_PAIRS_OUT": str(out), "TRACEML_RUNS_DIR": str(workdir / "runs")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("TRACEML_DISABLED", None)
    env.pop("OVERHEAD_PAIRS_FLOOR", None)
    env.pop("TRACEML_LIVE", None)
    env.pop("TRACEML_CAPTURE", None)
    env.update(OTLP)
    if not telemetry and CAPTURE_AB:
        env["TRACEML_CAPTURE"] = "0"  # telemetry on, deep captures (their poller and triggers) off
    elif not telemetry and LIVE_AB:
        env["TRACEML_LIVE"] = "off"  # telemetry on, the live view and the ranks' live records off
    elif not telemetry:
        env["TRACEML_DISABLED"] = "1"
    if floor:
        env["OVERHEAD_PAIRS_FLOOR"] = "1"
    env["OVERHEAD_PAIRS_TRACED"] = traced
    traceml = Path(sys.executable).with_name("traceml")
    return [str(traceml), "run", "--no-report", str(script), str(steps), str(warmup), str(hidden)], env


def run_once(script: Path, telemetry: bool, steps: int, warmup: int, hidden: int, workdir: Path,
             floor: bool = False, traced: str = "all") -> dict:
    out = workdir / "result.json"
    command, env = _command(script, telemetry, steps, warmup, hidden, workdir, out, floor, traced)
    subprocess.run(command, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def run_concurrently(script: Path, steps: int, warmup: int, hidden: int, workdir: Path,
                     cpus: tuple[int, int], control: bool = False, traced: str = "all") -> dict[bool, dict]:
    """Telemetry on and off at the same time, each whole tree (launcher, trainer, emitter) pinned to
    its own CPU (``cpus``: on's, off's), measuring from a common start: the machine's speed, which
    moves between runs, is the same for both sides of the pair."""
    barrier = workdir / "barrier"
    shutil.rmtree(barrier, ignore_errors=True)
    barrier.mkdir()
    processes = {}
    for telemetry, cpu in zip((True, False), cpus, strict=True):
        out = workdir / f"result-{telemetry}.json"
        command, env = _command(script, telemetry and not control, steps, warmup, hidden,
                                workdir / str(telemetry), out, traced=traced)
        env["OVERHEAD_PAIRS_BARRIER"] = str(barrier)
        processes[telemetry] = (subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu})), out)
    results = {}
    for telemetry, (process, out) in processes.items():
        if process.wait(timeout=600) != 0:
            raise RuntimeError(f"run failed (telemetry {telemetry})")
        results[telemetry] = json.loads(out.read_text())
    return results


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):+8.1f}   spread {min(values):+.1f}..{max(values):+.1f}"


def scenario(name: str, pairs: int, steps: int, warmup: int, workdir: Path, script: Path,
             show_tasks: bool = False, control: bool = False, hidden: int | None = None,
             raw: Path | None = None, concurrent: bool = False, floor: bool = False,
             traced: str = "all") -> None:
    default_hidden, hog_count = SCENARIOS[name]
    hidden = hidden or default_hidden
    wall_us, wall_pct, mean_us, cpu_us, loads, bare = [], [], [], [], [], []
    by_thread: dict[str, list[float]] = {}
    runs: list[tuple[dict, dict]] = []
    hogs = start_hogs(hog_count)
    try:
        for pair in range(pairs):
            results = {}
            if concurrent:
                loads.append(os.getloadavg()[0])
                results = run_concurrently(script, steps, warmup, hidden, workdir,
                                           (0, 1) if pair % 2 == 0 else (1, 0), control, traced)
            for telemetry in ((True, False) if pair % 2 == 0 else (False, True)) if not concurrent else ():
                loads.append(os.getloadavg()[0])
                results[telemetry] = run_once(script, telemetry and not control and not floor, steps,
                                              warmup, hidden, workdir, floor and telemetry, traced)
            on, off = results[True], results[False]
            runs.append((on, off))
            if raw is not None:
                raw.write_text(json.dumps({"scenario": name, "hidden": hidden, "control": control,
                                           "pairs": [{"on": a, "off": b} for a, b in runs]}, indent=1))
            wall_us.append((on["median_ns"] - off["median_ns"]) / 1000)
            wall_pct.append((on["median_ns"] / off["median_ns"] - 1) * 100)
            mean_us.append((on["mean_ns"] - off["mean_ns"]) / 1000)
            cpu_us.append((on["tree_cpu_ns"] - off["tree_cpu_ns"]) / 1000)
            bare.append(off["median_ns"] / 1000)
            if show_tasks:
                for task in sorted({*on["tasks_ns"], *off["tasks_ns"]}):
                    by_thread.setdefault(task, []).append(
                        (on["tasks_ns"].get(task, 0) - off["tasks_ns"].get(task, 0)) / 1000)
                by_thread.setdefault("trainer GC collections per 1000 steps", []).append(
                    on["gc_per_1000_steps"] - off["gc_per_1000_steps"])
                by_thread.setdefault("trainer GC time", []).append((on["gc_ns"] - off["gc_ns"]) / 1000)
                for label, result in (("on", on), ("off", off)):
                    busy = ", ".join(f"{task}: {ns / 1000:.1f}"
                                     for task, ns in sorted(result["tasks_ns"].items()))
                    print(f"    {label}: us/step by thread: {busy}; GC {result['gc_per_1000_steps']:.1f} "
                          f"per 1000 steps, {result['gc_ns'] / 1000:.1f} us/step")
            print(f"  {name} pair {pair + 1}: bare step {off['median_ns'] / 1e6:.3f} ms   wall "
                  f"{wall_us[-1]:+7.1f} us ({wall_pct[-1]:+.2f} %)   mean {mean_us[-1]:+7.1f} us   "
                  f"tree CPU {cpu_us[-1]:+7.1f} us/step (on {on['tree_cpu_ns'] / 1000:.0f}, "
                  f"off {off['tree_cpu_ns'] / 1000:.0f})", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    bare_ms = statistics.median(bare) / 1000
    label = (f"{name} (A/A control: telemetry off on both sides)" if control
             else f"{name} (floor: bare Python wrappers against nothing)" if floor
             else f"{name} (traced: {TRACED_PARTS[traced]})" if traced != "all" else name)
    print(f"{label}: {pairs} pairs, {steps} steps each, hidden {hidden}, bare step median {bare_ms:.3f} ms, "
          f"{hog_count} CPU hogs, load average {min(loads):.1f}..{max(loads):.1f}")
    print(f"  wall per step (median step), us:   {_spread(wall_us)}")
    print(f"  wall per step (median step), %:    {_spread(wall_pct)}")
    print(f"  wall per step (mean step), us:     {_spread(mean_us)}")
    print(f"  process-tree CPU per step, us:     {_spread(cpu_us)}", flush=True)
    _print_normalised(runs)
    for task, values in by_thread.items():
        print(f"    {task + ', on - off:':<42} {_spread(values)}", flush=True)


def _print_normalised(runs: list[tuple[dict, dict]]) -> None:
    """The CPU differences with each run scaled to the scenario's median machine speed: each run's
    calibration (the same small matmul-and-Python workload, run every 64 steps on the training thread)
    against the median calibration of all runs. This VM's speed moves by up to 2x between runs, more
    than telemetry's cost; scaling by it removes what of that drift hits the steps and the
    calibration alike."""
    speeds = [run.get("calibration_ns") for pair in runs for run in pair]
    if not speeds or None in speeds:
        return
    reference = statistics.median(speeds)
    print(f"  calibration, us (machine speed):   median {reference / 1000:8.1f}   spread "
          f"{min(speeds) / 1000:.1f}..{max(speeds) / 1000:.1f}")

    def scaled(run: dict, value: float) -> float:
        return value * reference / run["calibration_ns"]

    tree = [(scaled(on, on["tree_cpu_ns"]) - scaled(off, off["tree_cpu_ns"])) / 1000 for on, off in runs]
    trainer = [(scaled(on, on["tasks_ns"].get("trainer main", 0))
                - scaled(off, off["tasks_ns"].get("trainer main", 0))) / 1000 for on, off in runs]
    wall = [(scaled(on, on["median_ns"]) / scaled(off, off["median_ns"]) - 1) * 100 for on, off in runs]
    print(f"  wall per step, speed-scaled, %:     {_spread(wall)}")
    print(f"  process-tree CPU, speed-scaled, us: {_spread(tree)}")
    print(f"  training thread, speed-scaled, us:  {_spread(trainer)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3008, help="measured steps per run (a multiple of 64)")
    parser.add_argument("--warmup", type=int, default=192)
    parser.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    parser.add_argument("--tasks", action="store_true", help="also print each thread's CPU per step")
    parser.add_argument("--control", action="store_true",
                        help="A/A: telemetry off on both sides of each pair (the noise floor of the numbers)")
    parser.add_argument("--hidden", type=int, default=None,
                        help="the model's hidden width instead of the scenario's (sets the step time)")
    parser.add_argument("--raw", type=Path, default=None, help="write every run's numbers to this JSON file")
    parser.add_argument("--concurrent", action="store_true",
                        help="run on and off at the same time, each tree pinned to its own CPU (swapped "
                             "every pair): both see the same machine speed; each emitter shares its "
                             "trainer's CPU (no spare core), so the wall includes the emitter's work")
    parser.add_argument("--floor", action="store_true",
                        help="the 'on' side runs bare Python wrappers at the points telemetry hooks "
                             "(telemetry off): what any Python-level design costs there, on this machine")
    parser.add_argument("--traced", choices=list(TRACED_PARTS), default="all",
                        help="which part of telemetry the 'on' side turns on: " + "; ".join(
                            f"{key}: {text}" for key, text in TRACED_PARTS.items()))
    parser.add_argument("--live", action="store_true",
                        help="'off' is telemetry with TRACEML_LIVE=off (no live view, no rank-R.live.json) "
                             "instead of TRACEML_DISABLED=1: the live view's own cost")
    parser.add_argument("--capture", action="store_true",
                        help="'off' is telemetry with TRACEML_CAPTURE=0 instead of TRACEML_DISABLED=1: what "
                             "deep captures cost while none is taken (their poller thread and triggers)")
    parser.add_argument("--otlp", action="store_true",
                        help="export spans and metrics over OTLP/gRPC to a real rotel collector started here")
    parser.add_argument("--otlp-spans", choices=("all", "sampled"), default="all",
                        help="with --otlp: TRACEML_OTLP_SPANS (the span budget's mode)")
    args = parser.parse_args()
    global LIVE_AB, CAPTURE_AB
    LIVE_AB = args.live
    CAPTURE_AB = args.capture
    if args.floor and (args.control or args.concurrent):
        parser.error("--floor runs alone (not with --control or --concurrent)")
    rotel = None
    if args.otlp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from overhead import _start_rotel

        rotel, endpoint = _start_rotel()
        OTLP.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_METRICS_EXPORTER="otlp", TRACEML_OTLP_SPANS=args.otlp_spans)
        print(f"OTLP spans ({args.otlp_spans}) and metrics to rotel at {endpoint}", flush=True)
    try:
        _scenarios(args)
    finally:
        if rotel is not None:
            rotel.kill()


def _scenarios(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="overhead-pairs-") as temporary:
        workdir = Path(temporary)
        script = workdir / "trainer.py"
        script.write_text(TRAINER)
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        for name in SCENARIOS if args.scenario == "all" else [args.scenario]:
            started = time.monotonic()
            scenario(name, args.pairs, args.steps, args.warmup, workdir, script, args.tasks, args.control,
                     args.hidden, args.raw, args.concurrent, args.floor, args.traced)
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
