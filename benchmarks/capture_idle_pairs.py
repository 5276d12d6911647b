"""Deep captures armed but not firing, against captures off and a bare loop, in the same run.

    .venv/bin/python benchmarks/capture_idle_pairs.py                  # 5 rounds, ~0.5 ms steps
    .venv/bin/python benchmarks/capture_idle_pairs.py --rounds 8 --hidden 640

Each round launches ``traceml run`` four times on ``overhead_pairs.py``'s trainer (one torch thread, a
DataLoader, ``trace_step(model)`` in auto mode, the local copy on, no OTLP endpoint), in an order that
rotates every round:

- ``bare``: ``TRACEML_DISABLED=1``, the loop alone (the ratios' denominator);
- ``armed``: telemetry with deep captures on (the default: the poller thread, the emitter's triggers),
  none taken: the cost budget is set to nothing (``TRACEML_CAPTURE_BUDGET=0``,
  ``TRACEML_CAPTURE_WASTE_SHARE=0``: every automatic request refused, counted) since at the defaults a
  loop of small steps with a high residual pays for one capture (``docs/captures.md``); the script
  checks its folder for traces;
- ``off`` and ``off2``: telemetry with ``TRACEML_CAPTURE=0``. ``off2 - off`` is the A/A control: what
  two identical launches differ by on this machine, which ``armed - off`` must be read against.

Every run's wall per step (median step) is divided by the round's bare step, as measured and scaled to
the round's machine speed by each run's calibration (the same small workload every 64 steps on the
training thread; see ``overhead_pairs.py``). Printed: each round's ratios, then the median and spread of
``armed - off`` and of ``off2 - off`` in percent of the bare step, and of the training thread's CPU per
step (speed-scaled).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_pairs import TRAINER

SIDES = ("bare", "armed", "off", "off2")


def _env(side: str, out: Path, runs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "OVERHEAD_PAIRS_"))}
    env.update(OVERHEAD_PAIRS_OUT=str(out), OVERHEAD_PAIRS_TRACED="all", TRACEML_RUNS_DIR=str(runs))
    if side == "bare":
        env["TRACEML_DISABLED"] = "1"
    elif side != "armed":
        env["TRACEML_CAPTURE"] = "0"
    else:  # armed, never firing: every request refused by the budget
        env.update(TRACEML_CAPTURE_BUDGET="0", TRACEML_CAPTURE_WASTE_SHARE="0")
    return env


def run_side(side: str, script: Path, steps: int, warmup: int, hidden: int, work: Path) -> dict:
    """One launch; its result (``overhead_pairs``' trainer) and, for ``armed``, the captures it took."""
    out, runs = work / f"{side}.json", work / f"runs-{side}"
    out.unlink(missing_ok=True)
    traceml = Path(sys.executable).with_name("traceml")
    subprocess.run([str(traceml), "run", "--no-report", str(script), str(steps), str(warmup), str(hidden)],
                   env=_env(side, out, runs), check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    result["traces"] = len(list(runs.glob("*/rank-*.capture-*.trace.json.gz")))
    refused = 0
    for status in runs.glob("*/rank-*.capture-status.json"):
        refused += sum(json.loads(status.read_text()).get("refused", {}).values())
    result["refused"] = refused
    return result


def _spread(values: list[float], unit: str) -> str:
    return f"median {statistics.median(values):+7.2f} {unit}   spread {min(values):+.2f}..{max(values):+.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2048, help="measured steps per run (a multiple of 64)")
    parser.add_argument("--warmup", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=64, help="the model's width (64: ~0.5 ms CPU steps)")
    args = parser.parse_args()
    armed_pct, control_pct, armed_cpu, control_cpu, bare_ms, loads = [], [], [], [], [], []
    armed_raw, control_raw = [], []
    traces = refused = 0
    with tempfile.TemporaryDirectory(prefix="capture-idle-") as temporary:
        work = Path(temporary)
        script = work / "trainer.py"
        script.write_text(TRAINER)
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        for number in range(args.rounds):
            order = SIDES[number % 4:] + SIDES[:number % 4]
            results = {}
            for side in order:
                loads.append(os.getloadavg()[0])
                results[side] = run_side(side, script, args.steps, args.warmup, args.hidden, work / side)
            speed = statistics.median(r["calibration_ns"] for r in results.values())

            def scaled(side: str, key: str, results: dict = results, speed: float = speed) -> float:
                run = results[side]
                value = run["tasks_ns"].get("trainer main", 0) if key == "trainer" else run[key]
                return value * speed / run["calibration_ns"]

            bare = scaled("bare", "median_ns")
            armed_pct.append((scaled("armed", "median_ns") - scaled("off", "median_ns")) / bare * 100)
            control_pct.append((scaled("off2", "median_ns") - scaled("off", "median_ns")) / bare * 100)
            armed_cpu.append((scaled("armed", "trainer") - scaled("off", "trainer")) / 1000)
            control_cpu.append((scaled("off2", "trainer") - scaled("off", "trainer")) / 1000)
            bare_ms.append(results["bare"]["median_ns"] / 1e6)
            wall = {side: results[side]["median_ns"] for side in SIDES}
            armed_raw.append((wall["armed"] - wall["off"]) / wall["bare"] * 100)
            control_raw.append((wall["off2"] - wall["off"]) / wall["bare"] * 100)
            traces += results["armed"]["traces"]
            refused += results["armed"]["refused"]
            ratios = "   ".join(f"{side}/bare {wall[side] / wall['bare']:.3f} (scaled "
                                  f"{scaled(side, 'median_ns') / bare:.3f})" for side in SIDES[1:])
            print(f"  round {number + 1} ({', '.join(order)}): bare step {bare_ms[-1]:.3f} ms   {ratios}   "
                  f"armed captures {results['armed']['traces']}", flush=True)
    print(f"{args.rounds} rounds, {args.steps} steps each, hidden {args.hidden}, bare step median "
          f"{statistics.median(bare_ms):.3f} ms, load average {min(loads):.1f}..{max(loads):.1f}; "
          f"captures taken by the armed runs: {traces} (requests refused: {refused})")
    print(f"  wall per step, armed - off, % of bare:                   {_spread(armed_raw, '%')}")
    print(f"  wall per step, off2 - off (A/A), % of bare:              {_spread(control_raw, '%')}")
    print(f"  wall per step, speed-scaled, armed - off, % of bare:     {_spread(armed_pct, '%')}")
    print(f"  wall per step, speed-scaled, off2 - off (A/A), % of bare: {_spread(control_pct, '%')}")
    print(f"  training thread CPU, speed-scaled, armed - off, us:       {_spread(armed_cpu, 'us')}")
    print(f"  training thread CPU, speed-scaled, off2 - off (A/A), us:  {_spread(control_cpu, 'us')}",
          flush=True)


if __name__ == "__main__":
    main()
