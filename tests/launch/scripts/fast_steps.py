"""Many short steps (a tiny model padded to --step-ms by spinning); prints timing lines.

Prints ``loop_start`` when the training loop starts (a caller may load the CPUs from then on) and
``loop_done <unix time>`` when it ends, so a caller can time the exit.
"""

import argparse
import time

from busy_steps import BusySteps

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--step-ms", type=float, default=0.5)
args = parser.parse_args()

traceml.init(mode="auto")
trainer = BusySteps(args.step_ms)
print("loop_start", flush=True)
started = time.perf_counter()
trainer.run(args.steps)
print(f"loop_s {time.perf_counter() - started:.3f}", flush=True)
print(f"loop_done {time.time():.6f}", flush=True)
