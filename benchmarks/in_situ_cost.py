"""What the instrumentation costs the training thread in place, piece by piece, against bare steps.

    .venv/bin/python benchmarks/in_situ_cost.py                      # every hook and trace_step
    .venv/bin/python benchmarks/in_situ_cost.py --keep none           # trace_step alone, no hook
    .venv/bin/python benchmarks/in_situ_cost.py --keep ForwardHooks   # trace_step and one hook class
    .venv/bin/python benchmarks/in_situ_cost.py --keep bare           # bare against bare (the method's bias)

``hot_path.py`` times our code in tight loops, with warm caches. Between a real step's torch calls
our code runs cold. Here blocks of 8 steps alternate, many times, in one process: bare (every hook
uninstalled, no ``trace_step``), then traced (``trace_step`` plus the hooks named by ``--keep``).
The emitter runs in the background through both kinds of block (blocks this short spread its work
over both), so the difference is the training thread's own cost in place: the median over rounds of
(traced block's median step − bare block's median step). Printed with its quartiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--block-steps", type=int, default=8)
    parser.add_argument("--keep", default="all",
                        help="'all', 'none' (trace_step alone), 'bare' (no trace_step either), or hook "
                             "class names, comma-separated (ForwardHooks, BackwardPatch, ...)")
    args = parser.parse_args()

    from overhead import traced_setup

    import traceml_otel as traceml

    model, hooks, optimizer, loss_fn, source = traced_setup(args.hidden)
    names = [type(hook).__name__ for hook in hooks]
    keep = {"all": set(names), "none": set(), "bare": set()}.get(args.keep, set(args.keep.split(",")))
    traced_steps = args.keep != "bare"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    def block(traced: bool) -> float:
        global x, y
        walls = []
        for _ in range(args.block_steps):
            started = time.perf_counter_ns()
            x, y = next(source)
            if traced:
                with traceml.trace_step(model):
                    step()
            else:
                step()
            walls.append(time.perf_counter_ns() - started)
        return statistics.median(walls)

    time.sleep(2.0)  # the emitter finishes starting
    differences, bare_steps = [], []
    for _ in range(args.rounds):
        for hook in hooks:
            hook.uninstall()
        bare = block(False)
        for hook, name in zip(hooks, names, strict=True):
            if name in keep:
                hook.install()
        differences.append(block(traced_steps) - bare)
        bare_steps.append(bare)
    for hook in hooks:
        hook.uninstall()
    traceml.shutdown()
    low, _, high = statistics.quantiles(differences, n=4)
    added = statistics.median(differences) / 1000
    print(f"keep {args.keep} (hooks here: {', '.join(names)}): bare step "
          f"{statistics.median(bare_steps) / 1e6:.3f} ms, added {added:+.1f} us per step "
          f"(quartiles {low / 1000:+.0f}..{high / 1000:+.0f})")


x = y = None

if __name__ == "__main__":
    main()
