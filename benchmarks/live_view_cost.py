"""The launcher's CPU for the live view: ``traceml run --nproc-per-node N`` with ``--live panel|lines|off``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/live_view_cost.py [--ranks 8] [--steps 400] [--repeats 2]

Each launch runs with its stdout and stderr on a pseudo-terminal (so ``panel`` draws as on a real
terminal; this script reads the other end). While it runs, the launcher process's own CPU time
(``utime + stime`` of ``/proc/PID/stat``; its children, the ranks, are not in it) is sampled every
0.2 s; the last sample before it exits is its total. Modes are interleaved per repeat so machine noise
hits all alike. Prints, per mode, the launcher's CPU seconds, the wall time, and the view's cost: CPU
seconds over ``off`` divided by the wall time, as a share of one core (budget: 2 % at 8 ranks).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "live_ddp.py"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def one(mode: str, ranks: int, steps: int, runs: str) -> tuple[float, float]:
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=runs, PYTHONPATH=str(REPO), TERM="xterm-256color")
    started = time.perf_counter()
    job = subprocess.Popen([sys.executable, "-m", "traceml_otel.cli", "run", "--nproc-per-node", str(ranks),
                            "--live", mode, "--no-report", str(SCRIPT), str(steps), "0.02"],
                           stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)

    def drain() -> None:
        while True:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    if not os.read(master, 65536):
                        return
                except OSError:
                    return
            elif job.poll() is not None:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    last = 0.0
    while job.poll() is None:
        sample = cpu_seconds(job.pid)
        if sample is not None:
            last = sample
        time.sleep(0.2)
    wall = time.perf_counter() - started
    reader.join(timeout=5)
    os.close(master)
    if job.returncode != 0:
        raise SystemExit(f"--live {mode}: exit code {job.returncode}")
    return last, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    modes = ("off", "panel", "lines")
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as runs:
        for _ in range(args.repeats):
            for mode in modes:
                results[mode].append(one(mode, args.ranks, args.steps, runs))
    off_cpu = statistics.median(cpu for cpu, _ in results["off"])
    print(f"{args.ranks} ranks, {args.steps} steps of ~20 ms, {args.repeats} repeats (medians)")
    print(f"{'mode':<6} {'launcher CPU s':>14} {'wall s':>8} {'view % of a core':>17}")
    for mode in modes:
        cpu = statistics.median(c for c, _ in results[mode])
        wall = statistics.median(w for _, w in results[mode])
        view = "" if mode == "off" else f"{(cpu - off_cpu) / wall * 100:.2f}"
        print(f"{mode:<6} {cpu:>14.2f} {wall:>8.1f} {view:>17}")


if __name__ == "__main__":
    main()
