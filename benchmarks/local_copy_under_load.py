"""Is the local copy complete after a normal exit when the CPUs are busy? And how long is the exit?

    flock /tmp/traceml-heavy.lock .venv/bin/python benchmarks/local_copy_under_load.py [--steps 40000]

Runs ``tests/launch/scripts/fast_steps.py`` (steps of about 0.5 ms: a tiny model's forward,
backward and optimizer step, padded by spinning) with two CPU-bound neighbour processes and
OTLP export to a dead endpoint (a port nobody listens on), then counts the step spans in the
local copy and compares them with the steps traced. Prints the training-loop time, the exit
time (loop end to process end, which includes the local copy being finished) and what
``rank-0.export.json`` says. The neighbours start when the training loop does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "tests" / "launch" / "scripts" / "fast_steps.py"


def _spin() -> None:
    while True:
        pass


def dead_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def count_steps(traces: Path) -> set[int]:
    """Step numbers of every step span in a local-copy file (a strict JSON parse of each line)."""
    steps: set[int] = set()
    with traces.open() as handle:
        for line in handle:
            document = json.loads(line)
            for resource in document["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    for span in scope["spans"]:
                        if span["name"] == "traceml.step":
                            for attribute in span["attributes"]:
                                if attribute["key"] == "traceml.step.number":
                                    steps.add(int(attribute["value"]["intValue"]))
    return steps


def run(steps: int, neighbours: int, step_ms: float, protocol: str = "grpc",
        extra_env: dict[str, str] | None = None) -> dict[str, object]:
    """One load run; returns what it measured. The neighbours start with the training loop (the
    trainer's ``loop_start`` line), not during its start-up, and run until the trainer has exited."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(neighbours)]
    try:
        with tempfile.TemporaryDirectory(prefix="traceml-load-") as scratch, \
                tempfile.TemporaryFile("w+") as stderr:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
            env.update(TRACEML_RUNS_DIR=scratch, TRACEML_RUN_ID="load", PYTHONUNBUFFERED="1",
                       OTEL_EXPORTER_OTLP_ENDPOINT=dead_endpoint(), OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                       OTEL_EXPORTER_OTLP_TIMEOUT="1", **(extra_env or {}))
            started = time.time()
            trainer = subprocess.Popen([sys.executable, str(TRAINER), "--steps", str(steps),
                                        "--step-ms", str(step_ms)], env=env, stdout=subprocess.PIPE,
                                       stderr=stderr, text=True)
            assert trainer.stdout is not None
            first = trainer.stdout.readline()  # "loop_start", or "" when the trainer died first
            for spinner in spinners:
                spinner.start()
            stdout = first + trainer.communicate(timeout=3600)[0]
            ended = time.time()
            stderr.seek(0)
            result = subprocess.CompletedProcess(trainer.args, trainer.returncode, stdout, stderr.read())
            lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
            run_dir = Path(scratch) / "load"
            written = count_steps(run_dir / "rank-0.traces.jsonl")
            stats = json.loads((run_dir / "rank-0.export.json").read_text())
            return {
                "returncode": result.returncode,
                "steps": steps,
                "steps_in_local_copy": len(written & set(range(steps))),
                "loop_s": float(lines.get("loop_s", "nan")),
                "exit_s": ended - float(lines.get("loop_done", ended)),
                "local_done_s": (stats.get("local_copy_closed_unix") or ended)
                - float(lines.get("loop_done", ended)),
                "total_s": ended - started,
                "stats": stats,
                "stderr": result.stderr.strip().splitlines()[-6:],
            }
    finally:
        for spinner in spinners:
            if spinner.pid is not None:
                spinner.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--neighbours", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.5)
    args = parser.parse_args()
    out = run(args.steps, args.neighbours, args.step_ms)
    stats = out["stats"]
    print(f"{out['steps_in_local_copy']} of {out['steps']} steps in the local copy "
          f"({args.neighbours} CPU-bound neighbours, dead OTLP endpoint, rc {out['returncode']})")
    print(f"training loop {out['loop_s']:.1f} s ({out['loop_s'] / args.steps * 1e3:.2f} ms/step); "
          f"exit took {out['exit_s']:.1f} s (local copy closed after {out['local_done_s']:.1f} s); "
          f"whole run {out['total_s']:.1f} s")
    print(f"rank-0.export.json: steps_local={stats.get('steps_local')} "
          f"steps_traced={stats.get('steps_traced')} "
          f"local_copy_complete={stats.get('local_copy_complete')} clean_shutdown={stats['clean_shutdown']} "
          f"otlp_dropped={stats['otlp_dropped']} {stats['otlp_drop_reasons']}")
    for line in out["stderr"]:
        print(f"  stderr: {line}")


if __name__ == "__main__":
    main()
