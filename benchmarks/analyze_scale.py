"""Time the analyzer on a large synthetic run, both engines, and report peak memory.

    python benchmarks/analyze_scale.py                          # 8 ranks x 25,000 steps x 5 spans (1 M)
    python benchmarks/analyze_scale.py --ranks 1024 --steps 2000 --collectives \
        --dir /tmp/traceml-12m --memory-cap-gib 8               # 1,024 ranks x 2,000 x 6 spans (12.3 M)
    python benchmarks/analyze_scale.py --keep --engine columnar # reuse the generated run

The run is generated once into ``--dir`` (reused with ``--keep``) by the emitter's own span
builder, local-copy writer and step-table writer (``tests/synthetic_runs.py``), so it holds what a
real run writes: ``rank-R.traces.jsonl``, ``rank-R.steps.csv`` and its record. ``--collectives``
gives every step two DDP gradient buckets (one more span, and collective timing). Writing 12 M spans
through the writers takes about 400 CPU-seconds; ``--written-ranks N`` writes N ranks that way and
the others as byte copies of them with the rank rewritten (the rank attribute, the resource's
instance id, the table's rank column and record); the engines read each rank's files on their own,
so a copy costs them what a written rank does. Each analysis
(read, diagnose, render text + JSON) runs in a fresh child process with ``--engine python`` and/or
``columnar``, so the numbers exclude generation: wall seconds, the child's peak RSS, and the peak
RSS of its largest reader worker, and the CPU seconds of the analysis process and its workers
(on a loaded shared machine the CPU time says more than the wall time). ``--memory-cap-gib`` caps
each child's address space (a run that needs more fails with MemoryError, reported, instead of
pressing a shared machine). Delete ``--dir``
afterwards: the 12 M-span run takes about 10 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the synthetic-run writer lives in tests/

from tests.synthetic_runs import SyntheticStep, write_manifest_of, write_ranks
from traceml_otel.contract import traces_file_name
from traceml_otel.wire.step_table import (
    read_table_record,
    table_file_name,
    table_record_name,
    write_table_record,
)

RUN_ID = "bench-1m"
SPANS_PER_STEP = 5
SHAPE_FILE = "analyze_scale.json"
"""Beside the run: the ranks and steps it was generated with (for ``--keep``)."""


def _rank_steps(rank: int, steps: int, ranks: int, collectives: bool = False):
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
            ddp_wait=0.001 if collectives else None,
        )


def _write_rank(run_dir: str, rank: int, steps: int, ranks: int, collectives: bool) -> int:
    path = Path(run_dir)
    write_ranks(path, RUN_ID, _rank_steps(rank, steps, ranks, collectives), steps_per_line=64)
    return (path / traces_file_name(rank)).stat().st_size


def _copy_rank(run_dir: str, source: int, rank: int) -> int:
    """Rank ``rank``'s files as a copy of rank ``source``'s with its rank rewritten (spans, resource,
    table rows and the table's record): every other byte is the writers' own."""
    folder = Path(run_dir)
    traces = (folder / traces_file_name(source)).read_bytes()
    for old, new in ((f'"key":"traceml.rank","value":{{"intValue":"{source}"}}',
                      f'"key":"traceml.rank","value":{{"intValue":"{rank}"}}'),
                     (f'"{RUN_ID}/rank-{source}"', f'"{RUN_ID}/rank-{rank}"')):
        traces = traces.replace(old.encode(), new.encode())
    (folder / traces_file_name(rank)).write_bytes(traces)
    table = (folder / table_file_name(source)).read_bytes()
    (folder / table_file_name(rank)).write_bytes(
        table.replace(f"\n{RUN_ID},{source},".encode(), f"\n{RUN_ID},{rank},".encode()))
    record = read_table_record(folder / table_record_name(source))
    write_table_record(folder, replace(record, rank=rank))
    return len(traces)


def generate(run_dir: Path, ranks: int, steps: int, collectives: bool, written: int) -> None:
    """Write the synthetic run (in parallel, one rank per task): ``written`` ranks through the emitter's
    writers, the others as copies of them with their rank rewritten."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    started = time.perf_counter()
    with ProcessPoolExecutor() as pool:
        sizes = list(pool.map(_write_rank, [str(run_dir)] * written, range(written), [steps] * written,
                              [ranks] * written, [collectives] * written, chunksize=4))
        copies = range(written, ranks)
        sources = [r % written for r in copies]
        sizes += list(pool.map(_copy_rank, [str(run_dir)] * len(copies), sources, copies, chunksize=16))
    write_manifest_of(run_dir, RUN_ID, ranks)
    shape = {"ranks": ranks, "steps": steps, "collectives": collectives, "written": written}
    (run_dir / SHAPE_FILE).write_text(json.dumps(shape), encoding="utf-8")
    tables = sum(p.stat().st_size for p in run_dir.glob("rank-*.steps.csv"))
    spans = ranks * steps * (SPANS_PER_STEP + collectives)
    print(f"generated {spans:,} spans ({written} ranks written, {ranks - written} copied): "
          f"{sum(sizes) / 2**20:,.0f} MiB of OTLP JSON and {tables / 2**20:,.0f} MiB of step tables in "
          f"{run_dir} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)


def child(run_dir: Path, engine: str, cap_gib: float | None) -> None:
    """Analyse ``run_dir`` as ``traceml analyze --engine ENGINE`` does and print the peak RSS figures as
    JSON (or the error that stopped it)."""
    from traceml_otel.analyze import analyze_path
    from traceml_otel.report import render

    if cap_gib:
        limit = int(cap_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.perf_counter()
    try:
        analysis = analyze_path([run_dir], engine=engine)
    except MemoryError:
        print(json.dumps({"error": f"MemoryError past the {cap_gib} GiB cap",
                          "seconds": time.perf_counter() - started}))
        return
    render(analysis, "text")
    render(analysis, "json")
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": seconds,
                "spans": analysis.run.spans_read,
                "primary": str(analysis.step.primary.kind),
                "severity": str(analysis.step.primary.severity),
                "cpu_s": sum(getattr(resource.getrusage(who), field)
                             for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                             for field in ("ru_utime", "ru_stime")),
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
    parser.add_argument("--collectives", action="store_true", help="two DDP gradient buckets per step")
    parser.add_argument("--written-ranks", type=int, default=None, metavar="N",
                        help="write N ranks through the emitter's writers and the rest as copies of them "
                             "with the rank rewritten (default: all written)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/traceml-analyze-bench"))
    parser.add_argument("--keep", action="store_true", help="reuse a run already generated in --dir")
    parser.add_argument("--engine", choices=("python", "columnar", "both"), default="both")
    parser.add_argument("--memory-cap-gib", type=float, default=None, help="address-space cap per analysis")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per analysis")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-engine", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.dir, args.child_engine, args.memory_cap_gib)
        return 0
    shape = args.dir / SHAPE_FILE
    written = min(args.written_ranks or args.ranks, args.ranks)
    wanted = {"ranks": args.ranks, "steps": args.steps, "collectives": args.collectives, "written": written}
    fresh = not (args.keep and shape.exists() and json.loads(shape.read_text()) == wanted)
    if fresh:
        generate(args.dir, args.ranks, args.steps, args.collectives, written)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print("| spans | ranks | steps | engine | time (s) | CPU (s) | peak RSS (MiB) | verdict |")
    print("|---:|---:|---:|---|---:|---:|---:|---|")
    for engine in (("python", "columnar") if args.engine == "both" else (args.engine,)):
        command = [sys.executable, __file__, "--child", "--dir", str(args.dir), "--child-engine", engine]
        if args.memory_cap_gib:
            command += ["--memory-cap-gib", str(args.memory_cap_gib)]
        started = time.perf_counter()
        try:
            out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"| | {args.ranks} | {args.steps:,} | {engine} | > {args.timeout:.0f} (stopped) | | |")
            continue
        except subprocess.CalledProcessError as error:
            why = error.stderr.strip()[-300:]
            print(f"| | {args.ranks} | {args.steps:,} | {engine} | failed: {why} | | |")
            continue
        wall = time.perf_counter() - started
        stats = json.loads(out.stdout.strip().splitlines()[-1])
        if "error" in stats:
            print(f"| | {args.ranks} | {args.steps:,} | {engine} | {stats['error']} after "
                  f"{stats['seconds']:.0f} s | | |")
            continue
        rss = max(stats["rss_mib"], stats["worker_rss_mib"])
        print(f"| {stats['spans']:,} | {args.ranks} | {args.steps:,} | {engine} | {stats['seconds']:.1f} "
              f"({wall:.1f} wall) | {stats['cpu_s']:.1f} | {stats['rss_mib']:.0f} "
              f"(worker {stats['worker_rss_mib']:.0f}; max {rss:.0f}) "
              f"| {stats['primary']} {stats['severity']} |")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
