"""Time the analyzer on a synthetic run of about a million spans, and report its peak memory.

    python benchmarks/analyze_scale.py                     # 8 ranks x 25,000 steps x 5 spans
    python benchmarks/analyze_scale.py --ranks 2 --steps 2000 --keep

The run is generated once into ``--dir`` (reused with ``--keep``) by the emitter's own span
builder and local-copy writer (``tests/synthetic_runs.py``), so it holds what a real run writes.
The analysis (read, diagnose, render text + JSON) runs in a fresh child process, so the numbers
exclude generation: wall seconds, the child's peak RSS, and the peak RSS of its largest reader
worker.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic-run writer lives in tests/

from tests.synthetic_runs import SyntheticStep, write_manifest_of, write_ranks
from traceml_otel.contract import traces_file_name

RUN_ID = "bench-1m"
SPANS_PER_STEP = 5
SHAPE_FILE = "analyze_scale.json"
"""Beside the run: the ranks and steps it was generated with (for ``--keep``)."""


def _rank_steps(rank: int, steps: int, ranks: int):
    """A DDP-like run: rank 3 loads input slower, and every rank slows down after 60 % of the run."""
    slow_input = rank == 3 % ranks and ranks > 1
    for step in range(steps):
        drift = 0.004 if step > steps * 0.6 else 0.0
        yield SyntheticStep(
            rank=rank,
            step=step,
            world_size=ranks,
            parallelism="ddp",
            input_wait=0.006 if slow_input else 0.001,
            forward=0.004 + drift,
            backward=0.003 if slow_input else 0.008,
            optimizer=0.001,
            h2d=0.0004,
        )


def _write_rank(run_dir: str, rank: int, steps: int, ranks: int) -> int:
    path = Path(run_dir)
    write_ranks(path, RUN_ID, _rank_steps(rank, steps, ranks), steps_per_line=64)
    return (path / traces_file_name(rank)).stat().st_size


def generate(run_dir: Path, ranks: int, steps: int) -> None:
    """Write the synthetic run (in parallel, one rank per task)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with ProcessPoolExecutor() as pool:
        sizes = list(
            pool.map(_write_rank, [str(run_dir)] * ranks, range(ranks), [steps] * ranks, [ranks] * ranks)
        )
    write_manifest_of(run_dir, RUN_ID, ranks)
    (run_dir / SHAPE_FILE).write_text(json.dumps({"ranks": ranks, "steps": steps}), encoding="utf-8")
    print(
        f"generated {ranks * steps * SPANS_PER_STEP:,} spans, {sum(sizes) / 2**20:.0f} MiB in {run_dir}",
        file=sys.stderr,
    )


def child(run_dir: Path) -> None:
    """Analyse ``run_dir`` as ``traceml analyze`` does and print the peak RSS figures as JSON."""
    from traceml_otel.analyze import analyze_path
    from traceml_otel.report import render

    started = time.perf_counter()
    analysis = analyze_path([run_dir])
    render(analysis, "text")
    render(analysis, "json")
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "spans": analysis.run.spans_read,
                "primary": str(analysis.step.primary.kind),
                "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=25_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/traceml-analyze-bench"))
    parser.add_argument("--keep", action="store_true", help="reuse a run already generated in --dir")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.dir)
        return 0
    shape = args.dir / SHAPE_FILE
    wanted = {"ranks": args.ranks, "steps": args.steps}
    fresh = not (args.keep and shape.exists() and json.loads(shape.read_text()) == wanted)
    if fresh:
        generate(args.dir, args.ranks, args.steps)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--dir", str(args.dir)],
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"spans: {stats['spans']:,}  ranks: {args.ranks}  steps: {args.steps:,}  primary: {stats['primary']}"
    )
    print(f"analysis: {stats['seconds']:.1f} s in process, {wall:.1f} s wall with interpreter start")
    print(
        f"peak RSS: {stats['rss_mib']:.0f} MiB analyzer process, "
        f"{stats['worker_rss_mib']:.0f} MiB largest reader "
        "worker"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
