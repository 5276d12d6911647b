"""Two versions of traceml-otel side by side in real runs: each thread's CPU per step, interleaved.

    git archive <rev> traceml_otel | tar -x -C /tmp/before
    .venv/bin/python benchmarks/trees_ab.py --before /tmp/before --pairs 4
    .venv/bin/python benchmarks/trees_ab.py --before-env TRACEML_FLUSH_STEPS=64   # one tree, two settings

Both sides run ``overhead_pairs.py``'s training script under ``traceml run`` with telemetry on
(local copy, no endpoint), alternating which goes first; a side's tree is put first on
``PYTHONPATH`` (the launcher, the trainer and its emitter all import it from there). Telemetry on
both sides makes the emitter's thread comparable run by run: this VM's speed moves by up to 2x
between runs, so a change of a few microseconds shows only as the median of paired differences,
and only for a thread whose CPU does not swing with the training loop's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead_pairs

THREADS = ("emitter thread", "trainer main")


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="", help="the 'before' tree (a folder holding traceml_otel)")
    parser.add_argument("--after", default="", help="the 'after' tree (default: the installed one)")
    parser.add_argument("--before-env", nargs="*", default=[], help="KEY=VALUE settings for 'before'")
    parser.add_argument("--after-env", nargs="*", default=[], help="KEY=VALUE settings for 'after'")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=overhead_pairs.SCENARIOS["fast"][0])
    parser.add_argument("--hogs", type=int, default=0, help="busy-loop processes beside the runs")
    args = parser.parse_args()
    sides = {"before": (args.before, _env(args.before_env)), "after": (args.after, _env(args.after_env))}
    workdir = Path(tempfile.mkdtemp(prefix="trees-ab-"))
    script = workdir / "train.py"
    script.write_text(overhead_pairs.TRAINER)
    results: dict[str, list[dict]] = {side: [] for side in sides}
    saved = dict(os.environ)
    hogs = overhead_pairs.start_hogs(args.hogs)
    try:
        for pair in range(args.pairs):
            for side in (("before", "after") if pair % 2 == 0 else ("after", "before")):
                tree, env = sides[side]
                os.environ.clear()
                os.environ.update(saved, **env)
                if tree:
                    os.environ["PYTHONPATH"] = tree
                results[side].append(overhead_pairs.run_once(script, True, 3008, 200, args.hidden, workdir))
            before, after = results["before"][-1], results["after"][-1]
            print(f"pair {pair + 1}: " + "; ".join(
                f"{thread} {before['tasks_ns'][thread] / 1000:.1f} -> {after['tasks_ns'][thread] / 1000:.1f}"
                for thread in THREADS) + f"; median step {before['median_ns'] / 1000:.0f} -> "
                f"{after['median_ns'] / 1000:.0f} us", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for hog in hogs:
            hog.kill()
            hog.wait()
    for thread in THREADS:
        for side in sides:
            values = [run["tasks_ns"][thread] / 1000 for run in results[side]]
            print(f"{thread}, {side}: median {statistics.median(values):.1f} "
                  f"({min(values):.1f}..{max(values):.1f})")
        differences = [(a["tasks_ns"][thread] - b["tasks_ns"][thread]) / 1000
                       for a, b in zip(results["after"], results["before"], strict=True)]
        print(f"{thread}, after - before: median {statistics.median(differences):+.1f} "
              f"({min(differences):+.1f}..{max(differences):+.1f}) us per step")
    walls = [(a["median_ns"] / b["median_ns"] - 1) * 100
             for a, b in zip(results["after"], results["before"], strict=True)]
    print(f"median step, after / before: median {statistics.median(walls):+.2f} % "
          f"({min(walls):+.2f}..{max(walls):+.2f})")


if __name__ == "__main__":
    main()
