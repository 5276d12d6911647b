"""A real run whose emitter dies (SIGKILL) or is stopped (SIGSTOP) mid-run: the account and
``traceml analyze`` must name the rank and the steps that never reached the local copy.

    python benchmarks/emitter_death.py                      # both: 20,000 steps, fault at 3,000
    python benchmarks/emitter_death.py --action stop --stop-s 60

Runs ``traceml run tests/launch/scripts/emitter_fault.py`` in a scratch folder, prints the script's
exit code, the account, and the TELEMETRY_DEGRADED lines of ``traceml analyze`` on the run folder
(for ``stop``: once at the trainer's exit, and again after the emitter resumed and finished).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "emitter_fault.py"


def _analyze(run_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir)],
                         capture_output=True, text=True, timeout=600).stdout
    lines = out.splitlines()
    keep = [i for i, line in enumerate(lines) if "aligned steps" in line or "TELEMETRY DEGRADED" in line]
    shown = []
    for i in keep:
        shown.append(lines[i])
        j = i + 1
        while "TELEMETRY" in lines[i] and j < len(lines) and lines[j].startswith(" "):
            shown.append(lines[j])
            j += 1
    return "\n".join(shown)


def run(action: str, steps: int, at: int, stop_s: float) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="traceml-emitter-death-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env["TRACEML_RUNS_DIR"] = str(scratch / "runs")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", str(SCRIPT), "--",
         "--steps", str(steps), "--at", str(at), "--action", action, "--stop-s", str(stop_s)],
        env=env, capture_output=True, text=True, timeout=3600,
    )
    elapsed = time.monotonic() - started
    (run_dir,) = (scratch / "runs").iterdir()
    print(f"== {action} at step {at} of {steps} (stop {stop_s:g} s): traceml run exit code "
          f"{result.returncode} after {elapsed:.1f} s")
    print(result.stdout.strip())
    print("-- stderr (traceml lines):")
    print("\n".join(line for line in result.stderr.splitlines() if line.startswith("traceml")))
    print("-- traceml analyze at exit:")
    print(_analyze(run_dir))
    if action == "stop":
        time.sleep(max(0.0, stop_s - elapsed) + 5)
        print("-- traceml analyze after the emitter resumed:")
        print(_analyze(run_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--action", choices=("kill", "stop", "both"), default="both")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--at", type=int, default=3_000)
    parser.add_argument("--stop-s", type=float, default=60.0)
    args = parser.parse_args()
    for action in ("kill", "stop") if args.action == "both" else (args.action,):
        run(action, args.steps, args.at, args.stop_s)


if __name__ == "__main__":
    main()
