"""The emitter's work per step, counted, not timed: instructions and L1 misses (callgrind).

    .venv/bin/python benchmarks/emitter_instructions.py                      # this tree
    .venv/bin/python benchmarks/emitter_instructions.py --tree /tmp/before   # another tree (git archive)

The emitter's CPU per step in a real run (``overhead_pairs.py --tasks``) moves by ±5 µs between runs
on this VM, and ``emitter_cost.py``'s timings by as much, so a change of a few µs cannot be seen in
them. Counts can: the default path (local copy and step table, no endpoint) is fed the step rows an
``overhead_pairs.py`` trainer sends (three phases, a DataLoader wait, 32 samples, CPU clock), in frames
of 256 steps as the trainer batches them, through the frame reader and ``Emitter.handle_steps``:
decode, encode, both writes. A warm-up batch runs first (the shape's templates are made there); the
measured batches run inside one C call (``functools.reduce``), and callgrind (Debian package
``valgrind``) collects inside that call alone. Printed: instructions, L1 instruction and data read
misses per step, and the reference-path steps (should be 0 in the measured batches).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_instructions import callgrind_totals

CHILD = r'''
import functools, os, subprocess, sys, tempfile, time
from traceml_otel.emit.emitter import Emitter
from traceml_otel.wire.frames import FrameBuffer, encode_steps
from traceml_otel.wire.hello import Hello

BATCH, BATCHES = 256, int(sys.argv[1])


def control(switch):
    """callgrind_control answers only while this process runs Python: spin until it is done."""
    process = subprocess.Popen(["callgrind_control", "-i", switch, str(os.getpid())],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while process.poll() is None:
        sum(range(1000))


def rows(first):
    """Rows as the overhead_pairs trainer sends them (wire/step_row.py's layout)."""
    out = []
    for step in range(first, first + BATCH):
        start = 62_000_000_000_000 + step * 512_731
        phases = [["forward", 0, start + 37_512, start + 93_977, None, None, None],
                  ["backward", 0, start + 122_829, start + 235_171, None, None, None],
                  ["optimizer", 0, start + 240_766 + step % 7, start + 316_933 + step % 13, None, None, None]]
        out.append([step, start, start + 320_363 + step % 11, None, 150_650 + step % 17, None, 1, None, 1,
                    "none", None, None, None, None, phases, [], 32, None, None, "trace_step",
                    166_305 + step % 5])
    return out


with tempfile.TemporaryDirectory() as run_dir:
    hello = Hello(run_id="bench", rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                  anchor_ns=time.time_ns(), shutdown_timeout_s=30.0, service_name="bench", run_dir=run_dir,
                  traces_endpoint=None, traces_protocol=None, metrics_endpoint=None, metrics_protocol=None,
                  sampler="always_on")
    emitter = Emitter(hello)
    frames = [encode_steps(rows(batch * BATCH)) for batch in range(BATCHES + 1)]
    buffer = FrameBuffer()

    def handle(_, data):
        buffer.feed(data)
        while (frame := buffer.next_frame()) is not None:
            emitter.handle_steps(frame["s"])
        return None

    handle(None, frames[0])  # the warm-up batch: the first step and the shape's templates
    reference = emitter.lines.reference_steps
    control("on")
    functools.reduce(handle, frames[1:], None)
    control("off")
    emitter.finish("ok", 0, True)
    print("reference-path steps in the measured batches:", emitter.lines.reference_steps - reference)
'''

EVENTS = ("Ir", "I1mr", "D1mr", "D1mw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", help="a folder holding the traceml_otel package to measure (default: "
                                       "the installed one)")
    parser.add_argument("--batches", type=int, default=8, help="measured batches of 256 steps")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        child, out = Path(folder) / "child.py", Path(folder) / "callgrind.out"
        child.write_text(CHILD)
        env = dict(os.environ)
        if args.tree:
            env["PYTHONPATH"] = str(Path(args.tree).resolve())
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--instr-atstart=no", "--collect-atstart=no",
             "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}",
             sys.executable, str(child), str(args.batches)],
            env=env, check=True, capture_output=True, text=True, timeout=1800)
        if not out.exists():
            sys.exit(result.stderr[-2000:])
        steps = args.batches * 256
        counts = callgrind_totals(out)
        print(f"{steps} steps in frames of 256 ({args.tree or 'installed tree'}); per step:")
        for name in EVENTS:
            if name in counts:
                print(f"  {name:5s} {counts[name] / steps:10,.0f}")
        print(" ", (result.stdout.strip().splitlines() or ["(the child printed nothing)"])[-1])


if __name__ == "__main__":
    main()
