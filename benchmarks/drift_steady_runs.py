"""False drift on steady short runs: 10 back-to-back 100-step blocks of a steady loop, traced for real,
each analysed as a run of its own; prints how many blocks the drift rule calls drifting.

    .venv/bin/python benchmarks/drift_steady_runs.py --repeats 5

Each repeat runs ``tests/analyze/scripts/steady_blocks.py`` under the real capture and local copy (one
unjudged warm-up block first), then analyses every block with steps renumbered from 0, which is what a
user's 100-step run looks like to the analyzer. This was a suite test; on the shared 2-core VM the
count was 0-3 of 10 from run to run (a block's steps sometimes hold a level 30-40 % off for its last
part), so it is a measurement here and the rule's noise bound is unit-tested on synthetic series
(``tests/analyze/test_analyze_memory_drift.py``). See docs/analyzer.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from traceml_otel.analyze import analyze_run  # noqa: E402
from traceml_otel.analyze.kinds import DriftKind  # noqa: E402
from traceml_otel.analyze.run_model import LoadedRun  # noqa: E402
from traceml_otel.analyze.sources.files import FileSpanSource  # noqa: E402

SCRIPT = REPO / "tests" / "analyze" / "scripts" / "steady_blocks.py"


def drifting_blocks(blocks: int, steps: int) -> list[tuple[int, str, float]]:
    """(block, kind, change) of every judged block the rule calls drifting, in one real run."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
        env.update(TRACEML_RUNS_DIR=str(Path(tmp) / "runs"))
        subprocess.run([sys.executable, str(SCRIPT), "--blocks", str(blocks + 1), "--steps", str(steps)],
                       env=env, check=True, timeout=300)
        (run_dir,) = (Path(tmp) / "runs").iterdir()
        loaded = FileSpanSource([run_dir]).load()
        found = []
        for block in range(1, blocks + 1):  # block 0 is the process's own warm-up
            part = tuple(s._replace(step=s.step - block * steps) for s in loaded.steps
                         if s.step // steps == block)
            drift = analyze_run(LoadedRun(run_id=f"block-{block}", steps=part, source=str(run_dir))).drift
            if drift.kind is not DriftKind.STABLE:
                found.append((block, drift.kind.value, drift.change or 0.0))
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    counts = []
    for repeat in range(args.repeats):
        found = drifting_blocks(args.blocks, args.steps)
        counts.append(len(found))
        detail = ", ".join(f"block {b} {kind} {change:+.0%}" for b, kind, change in found)
        load = os.getloadavg()[0]
        print(f"repeat {repeat + 1}: {len(found)} of {args.blocks} blocks drifting (load {load:.1f})"
              + (f": {detail}" if detail else ""), flush=True)
    print(f"drifting blocks per run: {counts}; {sum(counts)} of {args.blocks * args.repeats} blocks")


if __name__ == "__main__":
    main()
