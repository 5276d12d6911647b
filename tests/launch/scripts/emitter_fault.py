"""Short steps; at ``--at`` the script kills (SIGKILL) or stops (SIGSTOP) its own emitter process.

``--stop-s S``: a detached helper sends SIGCONT S seconds later, so a stop can last across the exit
(``0``: none does; the caller resumes the printed pid).
Prints ``emitter <pid> <action> at step <n>``.
"""

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path

from busy_steps import BusySteps

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--at", type=int, default=300)
parser.add_argument("--action", choices=("kill", "stop"), default="kill")
parser.add_argument("--stop-s", type=float, default=5.0)
parser.add_argument("--step-ms", type=float, default=0.2)
args = parser.parse_args()


def emitter_pids() -> list[int]:
    """Our child processes running the emitter (found in /proc, as an operator would)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"traceml_otel.emit.worker" in cmdline:
                pids.append(int(child))
    return pids


def fault(step: int) -> None:
    if step != args.at:
        return
    time.sleep(1.5)  # the emitter catches up and writes its periodic counts, as in a long run
    for pid in emitter_pids():
        if args.action == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGSTOP)
            if args.stop_s > 0:  # 0: whoever runs the script sends SIGCONT
                resume = f"sleep {args.stop_s}; kill -CONT {pid}"
                subprocess.Popen(["sh", "-c", resume], start_new_session=True)
        print(f"emitter {pid} {args.action} at step {step}", flush=True)


traceml.init(mode="auto")
BusySteps(args.step_ms).run(args.steps, before_step=fault)
print("loop_done", flush=True)
