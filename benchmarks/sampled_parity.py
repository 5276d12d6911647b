"""Verdict parity between every span and a span-budget sample, on every diagnosis scenario (not a test).

Each script in examples/diagnosis runs under ``traceml run`` (CPU, gloo; 2 ranks where the scenario
needs them) for ``--steps`` steps. Its local copy (every step) is replayed through the emitter's own
span budget at ``--rate`` (``tests/sampled_spans.py``) and both span sets are analysed as
``traceml analyze --tempo`` reads them (a fake Tempo answering the search API, as in
``tests/analyze/test_analyze_backends.py``). Printed per scenario: the verdict on all spans and on
the sample, the largest share difference (points) and the spans kept.

    python benchmarks/sampled_parity.py [--steps 300] [--rate 0.1] [--only input_bound.py,...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.analyze.test_sampled_parity import SCENARIOS, SHARES, run_scenario, shares  # noqa: E402
from tests.sampled_spans import read_local_spans, sample_run_spans  # noqa: E402
from traceml_otel.emit.span_budget import BudgetSettings  # noqa: E402

TWO_RANKS = {"input_straggler.py", "slow_rank.py", "sync_straggler.py", "communication_bound.py",
             "loader_free_ddp.py", "tiny_collectives.py"}


def serve(handler: type) -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    from tests.analyze.test_sampled_parity import through_tempo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--only", default="", help="comma-separated scenario scripts")
    args = parser.parse_args()
    scripts = [s for s in sorted(p.name for p in SCENARIOS.glob("*.py")) if not s.startswith("_")]
    if args.only:
        scripts = [s for s in scripts if s in args.only.split(",")]
    print(f"{args.steps} steps, sample at {args.rate:g}; shares: {', '.join(SHARES)}")
    print("scenario | verdict, all spans | verdict, sample | same | max share diff (points) | spans kept")
    for script in scripts:
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            launcher = ("--nproc-per-node", "2") if script in TWO_RANKS else ()
            try:
                run_dir = run_scenario(Path(tmp), script, args.steps, *launcher)
            except AssertionError as error:
                print(f"{script} | did not run: {str(error).strip().splitlines()[-1][:120]}")
                continue
            spans = read_local_spans(run_dir)
            world = 2 if launcher else 1
            sampled, _ = sample_run_spans(spans, BudgetSettings("sampled", args.rate, 0.0), world)
            everything, sample = through_tempo(serve, spans), through_tempo(serve, sampled)
        full, part = shares(everything), shares(sample)
        diff = max(abs(full[name] - part[name]) for name in SHARES) * 100
        kinds = everything.step.primary.kind.value, sample.step.primary.kind.value
        print(f"{script} | {kinds[0]} | {kinds[1]} | {kinds[0] == kinds[1]} | {diff:.1f} | "
              f"{len(sampled)}/{len(spans)}   ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
