"""Start-up cost of ``traceml run`` over plain ``python``, for a script that only imports torch.

    .venv/bin/python benchmarks/launcher_startup.py [--repeats 5]

Times, in the same run and interleaved (so machine noise hits all alike), the wall time of
``python script.py``, ``traceml run --no-report script.py`` and ``traceml run script.py`` (which
also prints the end-of-run account), and of ``traceml run --nproc-per-node 2`` for reference (the
elastic agent). Prints the median of each and the difference against ``python``. Budget: the
one-process launcher adds at most 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(command: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--agent", action="store_true", help="also time --nproc-per-node 2 (slow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "only_torch.py"
        script.write_text("import torch\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
        env["TRACEML_RUNS_DIR"] = str(Path(scratch) / "runs")
        cli = [sys.executable, "-m", "traceml_otel.cli", "run"]
        cases = {
            "python script.py": [sys.executable, str(script)],
            "traceml run --no-report script.py": [*cli, "--no-report", str(script)],
            "traceml run script.py": [*cli, str(script)],
        }
        if args.agent:
            cases["traceml run --nproc-per-node 2 (agent)"] = [*cli, "--nproc-per-node", "2", str(script)]
        times: dict[str, list[float]] = {name: [] for name in cases}
        wall(cases["python script.py"], env, scratch)  # warm the file cache
        for _ in range(args.repeats):
            for name, command in cases.items():
                times[name].append(wall(command, env, scratch))
    bare = statistics.median(times["python script.py"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<42} median {median:5.2f} s  (min {min(values):5.2f})  "
              f"over python {median - bare:+5.2f} s")


if __name__ == "__main__":
    main()
