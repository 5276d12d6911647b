"""Repeat the three communication scenarios and count their verdicts (issue 20's 10x proof).

    .venv/bin/python benchmarks/communication_split.py [--repeats 10] [--steps 30]

Each scenario runs ``traceml run ... --nproc-per-node 2`` (CPU, gloo) ``--repeats`` times in a
row and reads the ``report.json`` it leaves:

- ``slow_rank.py --ddp``: rank 1's forward sleeps 10 ms; expected: rank 1's straggler finding
  (``COMPUTE_STRAGGLER``, culprit 1) with rank 0's waiting attributed to rank 1;
- ``communication_bound.py``: ~38 MiB of gradients, tiny compute; expected: ``COMMUNICATION_BOUND``
  in the bandwidth regime;
- ``tiny_collectives.py``: 48 one-element all-reduces per step; expected: ``COMMUNICATION_BOUND``
  in the latency regime.

Prints one line per run and the counts; exits 1 when any run missed its expectation.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "examples" / "diagnosis"


def run(script: str, steps: int, extra: tuple[str, ...], workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(workdir / "runs"), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "r", str(SCENARIOS / script),
         "--nproc-per-node", "2", "--", "--steps", str(steps), *extra],
        env=env, cwd=workdir, capture_output=True, text=True, timeout=300, check=False,
    )
    if result.returncode != 0:
        return {"error": result.stderr[-500:]}
    return json.loads((workdir / "runs" / "r" / "report.json").read_text())


def verdict(report: dict) -> str:
    """``KIND culprit=R waited_for=R regime=X``: what the checks compare."""
    if "error" in report:
        return "ERROR"
    primary = report["primary_diagnosis"]
    evidence = {e["name"]: e["value"] for e in primary["evidence"]}
    words = [primary["kind"]]
    if "culprit_rank" in evidence:
        words.append(f"culprit={evidence['culprit_rank']}")
        waited = {r["rank"]: r.get("communication_waited_for") or [] for r in report["ranks"]}
        words.append(f"rank0_waited_for={[w['rank'] for w in waited.get(0, [])][:1]}")
    if "regime" in evidence:
        words.append(f"regime={evidence['regime']}")
    return " ".join(words)


EXPECTED = {
    "slow_rank.py --ddp": "COMPUTE_STRAGGLER culprit=1 rank0_waited_for=[1]",
    "communication_bound.py": "COMMUNICATION_BOUND regime=bandwidth",
    "tiny_collectives.py": "COMMUNICATION_BOUND regime=latency",
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    failed = False
    for scenario, expected in EXPECTED.items():
        script, *extra = scenario.split()
        counts: collections.Counter[str] = collections.Counter()
        for index in range(args.repeats):
            with tempfile.TemporaryDirectory() as directory:
                began = time.monotonic()
                seen = verdict(run(script, args.steps, tuple(extra), Path(directory)))
            counts[seen] += 1
            elapsed = time.monotonic() - began
            print(f"{scenario:<24} run {index + 1:>2}: {seen}  ({elapsed:.1f} s)", flush=True)
        ok = counts[expected] == args.repeats
        failed |= not ok
        summary = ", ".join(f"{n}x {v}" for v, n in counts.most_common())
        status = "OK " if ok else "BAD"
        print(f"{scenario:<24} {status} {counts[expected]}/{args.repeats} as expected: {summary}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
