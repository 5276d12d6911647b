"""How often ``traceml compare --fail-on-regression`` is right on a noisy machine (A/A and planted changes).

    python benchmarks/compare_aa.py                     # the full table (about 40 min on a loaded 2-core VM)
    python benchmarks/compare_aa.py --pairs 4 4 2       # a shorter run
    python benchmarks/compare_aa.py --keep DIR          # keep the runs ...
    python benchmarks/compare_aa.py --recompare DIR     # ... and compare them again (after a change)
    python benchmarks/compare_aa.py --runs 1 5 1        # runs per side of each group (default 1 5 1)
    python benchmarks/compare_aa.py --env TRACEML_CAPTURE_AUTO=0   # a variable for every run

Three groups of pairs of short ``traceml run``s of one CPU loop (torch on 1 thread, in-memory data,
1,875 steps of batch 16, a few seconds each), each pair compared with
``traceml compare A B --json --fail-on-regression``:

- **A/A**: the same script twice; in every other pair a CPU hog (one busy process per core) runs
  beside one side (A or B in turn). Right: exit 0.
- **planted slowdown**: at the end of each of B's steps its thread spins until it has spent 15 % more
  CPU time than the iteration took (``time.thread_time_ns``): 15 % more work per sample whatever the
  load (no hog; the other tenants' load stays). By default 5 runs per side, A and B interleaved,
  compared as ``compare A1..A5 --against B1..B5`` (one run per side cannot resolve 15 % on a shared VM
  whose identical runs differ by 10-30 %: see docs/analyzer.md).
  Right: REGRESSION (exit 1).
- **batch 16 -> 64**: the same samples in batches of 64 instead of 16, the hog beside B.
  Right: IMPROVEMENT.

Prints one row per group: pairs, exit 0, REGRESSION, IMPROVEMENT, other verdicts, and the measured
false-alarm rate of the A/A group. A benchmark, not a test: the machine's load is part of it.
With ``--loop`` the script is the training loop itself (what the pairs launch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def loop(batch: int, reps: int, samples: int, slower: float = 0.0) -> None:
    """The training loop the pairs run: a forward/backward of a small MLP and ``reps`` matrix products
    of the batch inside each step. ``slower``: at the end of each step the thread spins until it has
    spent that fraction more CPU time than the iteration's work so far (``time.thread_time_ns``): a
    planted slowdown of the loop's own work per sample that the machine's load does not change."""
    import torch
    from torch import nn

    import traceml_otel as traceml

    traceml.init(mode="auto")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(samples, 64)
    weight = torch.randn(64, 64) / 8
    for start in range(0, samples - batch + 1, batch):
        x = data[start:start + batch]
        began = time.thread_time_ns()  # the whole iteration, telemetry's part included
        with traceml.trace_step(model, samples=batch):
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                h = x
                for _ in range(reps):
                    h = torch.tanh(h @ weight)
            (model(x).square().mean() + h.mean()).backward()
            optimizer.step()
            if slower:
                until = time.thread_time_ns() + int((time.thread_time_ns() - began) * slower)
                while time.thread_time_ns() < until:
                    pass


def start_hog() -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]


def stop_hog(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


EXTRA_ENV: dict[str, str] = {}
"""Variables every run gets (``--env``), e.g. ``TRACEML_CAPTURE_AUTO=0``."""


def run_once(runs_dir: Path, run_id: str, batch: int, slower: float, samples: int, hog: bool) -> Path:
    hogs = start_hog() if hog else []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
        env["TRACEML_RUNS_DIR"] = str(runs_dir)
        env.update(EXTRA_ENV)
        subprocess.run(
            [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", run_id, "--no-report", str(HERE),
             "--loop", "--batch", str(batch), "--slower", str(slower), "--samples", str(samples)],
            env=env, check=True, capture_output=True, timeout=300,
        )
    finally:
        stop_hog(hogs)
    return runs_dir / run_id


def compare(a: list[Path], b: list[Path]) -> tuple[int, str, str]:
    sides = [str(a[0]), str(b[0])] if len(a) == len(b) == 1 else [*map(str, a), "--against", *map(str, b)]
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "compare", *sides, "--json",
                           "--fail-on-regression"], capture_output=True, text=True, timeout=600)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        return done.returncode, "ERROR", done.stderr.strip()[-200:]
    interval = document.get("interval") or {}
    cpu = document.get("cpu_interval") or {}
    detail = (f"{interval.get('name', '?')} {interval.get('change', 0) * 100:+.1f}% "
              f"(±{interval.get('half_width', 0) * 100:.1f}%) on-CPU {cpu.get('change', 0) * 100:+.1f}% "
              f"(±{cpu.get('half_width', 0) * 100:.1f}%) "
              f"waitA {document['a'].get('cpu_wait_share') or 0:.2f} "
              f"waitB {document['b'].get('cpu_wait_share') or 0:.2f}")
    return done.returncode, document["verdict"], detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--slower", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--pairs", type=int, nargs=3, default=(20, 10, 10), metavar=("AA", "SLOW", "BATCH"))
    parser.add_argument("--runs", type=int, nargs=3, default=(1, 5, 1), metavar=("AA", "SLOW", "BATCH"),
                        help="runs per side in each group (default 1 5 1)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep the runs here (with plan.json)")
    parser.add_argument("--recompare", type=Path, metavar="DIR",
                        help="only compare the runs kept in DIR again")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this variable for every run (repeatable)")
    args = parser.parse_args()
    EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    if args.loop:
        loop(args.batch, args.reps, args.samples, args.slower)
        return
    aa, slow, batch = args.pairs
    runs_aa, runs_slow, runs_batch = args.runs
    plans = (
        [("A/A", (16, 0.0), (16, 0.0), ("", "a", "", "b")[i % 4], runs_aa) for i in range(aa)]
        + [("planted +15 % CPU work", (16, 0.0), (16, 0.15), "", runs_slow) for _ in range(slow)]
        + [("batch 16 -> 64, hog beside B", (16, 0.0), (64, 0.0), "b", runs_batch) for _ in range(batch)]
    )
    results: dict[str, list[tuple[int, str]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compare-aa-") as tmp:
        runs = args.recompare or args.keep or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        if args.recompare:
            plans = [tuple(p) for p in json.loads((runs / "plan.json").read_text())]
        else:
            (runs / "plan.json").write_text(json.dumps(plans))
        for index, (group, (batch_a, slow_a), (batch_b, slow_b), hog, *rest) in enumerate(plans):
            per_side = rest[0] if rest else 1
            names = [("", "")] if per_side == 1 else [(str(j), str(j)) for j in range(per_side)]
            a = [runs / f"p{index}-a{n}" for n, _ in names]
            b = [runs / f"p{index}-b{n}" for _, n in names]
            if not args.recompare:
                for run_a, run_b in zip(a, b, strict=True):  # interleaved: A1 B1 A2 B2 ...
                    run_once(runs, run_a.name, batch_a, slow_a, args.samples, hog == "a")
                    run_once(runs, run_b.name, batch_b, slow_b, args.samples, hog == "b")
            code, verdict, detail = compare(a, b)
            key = group if per_side == 1 else f"{group}, {per_side} runs per side"
            results.setdefault(key, []).append((code, verdict))
            print(f"{index:3d} {key:<30} hog={hog or '-':<2} exit {code}  {verdict:<12} {detail}",
                  flush=True)
    print(f"\n{time.monotonic() - started:.0f} s, load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| pairs | group | exit 0 | REGRESSION | IMPROVEMENT | other |\n|---|---|---|---|---|---|")
    for group, rows in results.items():
        verdicts = [v for _, v in rows]
        other = len(rows) - verdicts.count("REGRESSION") - verdicts.count("IMPROVEMENT")
        print(f"| {len(rows)} | {group} | {sum(1 for c, _ in rows if c == 0)} | "
              f"{verdicts.count('REGRESSION')} | "
              f"{verdicts.count('IMPROVEMENT')} | {other} |")
    aa_rows = results.get("A/A", [])
    if aa_rows:
        alarms = sum(1 for c, _ in aa_rows if c != 0)
        share = alarms / len(aa_rows) * 100
        print(f"\nA/A false alarms (exit != 0): {alarms} of {len(aa_rows)} ({share:.0f} %)")


if __name__ == "__main__":
    main()
