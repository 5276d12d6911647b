"""What the copy-safe forward hooks cost against bound methods with the same logic (CPU).

    .venv/bin/python benchmarks/copy_safe_hooks.py [BLOCKS]

The forward hooks on a traced model are :class:`CopySafeHook` objects (``capture/copy_safe.py``), so
``copy.deepcopy(model)`` and ``torch.save(model)`` work. torch calls an object through its class's
``__call__`` (CPython's slower ``tp_call`` path); a bound method, what the hooks were before, takes
the interpreter's fast path. This times both on the same logic (the objects' own ``__call__``, bound)
in alternating blocks: the hook pair called as torch calls it, and a traced ``nn.Linear`` forward
against a bare one (the ratio), best and median of the blocks, as the calling thread's CPU time.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from types import MethodType

import torch
from torch import nn

from traceml_otel.capture.forward_hooks import ForwardHooks
from traceml_otel.capture.recorder import StepRecorder


class Discard:
    def send_steps(self, rows: list) -> None:
        pass


def per_call_us(call: Callable[[], object], calls: int) -> float:
    started = time.thread_time_ns()
    for _ in range(calls):
        call()
    return (time.thread_time_ns() - started) / calls / 1000


def main(blocks: int = 20, calls: int = 20_000) -> None:
    torch.set_num_threads(1)
    recorder = StepRecorder(Discard(), flush_steps=64)
    x = torch.randn(2, 4)
    objects, bound = ForwardHooks(recorder), ForwardHooks(recorder)
    bound.before_forward = MethodType(type(bound.before_forward).__call__, bound.before_forward)
    bound.after_forward = MethodType(type(bound.after_forward).__call__, bound.after_forward)
    models = {"bare": nn.Linear(4, 4), "objects": nn.Linear(4, 4), "bound": nn.Linear(4, 4)}
    objects.watch(models["objects"])
    bound.watch(models["bound"])

    def pair(hooks: ForwardHooks) -> Callable[[], None]:
        before, after = hooks.before_forward, hooks.after_forward

        def call() -> None:
            before(None, ())
            after(None, (), None)
        return call

    cases: dict[str, Callable[[], object]] = {
        f"forward, {name}": (lambda m=m: m(x)) for name, m in models.items()}
    cases.update({"hook pair, objects": pair(objects), "hook pair, bound": pair(bound)})
    times: dict[str, list[float]] = {name: [] for name in cases}
    recorder.begin_step()
    for _ in range(blocks):
        for name, call in cases.items():
            times[name].append(per_call_us(call, calls))
        recorder.end_step()  # phases of one step stay bounded
        recorder.begin_step()
    recorder.end_step()
    best = {name: min(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:<20} best {best[name]:7.3f} us   median {statistics.median(values):7.3f} us")
    bare = best["forward, bare"]
    for name in ("objects", "bound"):
        print(f"traced forward / bare forward, {name}: {best[f'forward, {name}'] / bare:5.3f} "
              f"(+{best[f'forward, {name}'] - bare:.2f} us)")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"hook objects minus bound methods, per step (the pair): "
          f"{best['hook pair, objects'] - best['hook pair, bound']:+.3f} us best, "
          f"{median['hook pair, objects'] - median['hook pair, bound']:+.3f} us median")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
