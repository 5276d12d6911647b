"""Optimizer steps counted once whether or not an optimizer predates the hooks (a fresh process).

``optimizer_hooks_fallback.py [known]`` prints one JSON object: for each stage, whether torch's global
step hooks were registered, how many optimizers' own ``step`` got the outer wrapper, and the optimizer
phases and updates recorded per step. ``known``: every optimizer is recorded from the start, as
zero-code tracing does from the moment ``torch`` is imported.
"""

import gc
import json
import sys
import weakref

import torch
from torch import nn

from tests.capture.list_sink import ListSink
from traceml_otel.capture import hooks
from traceml_otel.capture.inferred_steps import optimizer_of
from traceml_otel.capture.optimizer_registry import OPTIMIZERS
from traceml_otel.capture.recorder import StepRecorder

sink = ListSink()
recorder = StepRecorder(sink, flush_steps=1000)


def stepped(*optimizers: torch.optim.Optimizer) -> list[tuple[list[str], int]]:
    """One recorded step per optimizer: its phases and updates."""
    sink.rows.clear()
    for optimizer in optimizers:
        recorder.begin_step()
        optimizer.step()
        recorder.end_step()
    recorder.flush()
    return [([p.phase for p in record.phases], record.optimizer_steps) for record in sink.records()]


def optimizer() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = nn.Linear(4, 4)
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    made = torch.optim.SGD(model.parameters(), lr=0.1)
    return made, torch.optim.lr_scheduler.StepLR(made, step_size=1)  # it wraps made.step on the instance


report: dict[str, object] = {}
if sys.argv[1:] == ["known"]:
    OPTIMIZERS.track()
    early, scheduler = optimizer()  # before the hooks, as a script builds it before its loop
    hooks_now = hooks.OptimizerHooks(recorder)
    updated: list[object] = []
    hooks_now.after_update = lambda given, args: updated.append(optimizer_of(given, args))
    hooks_now.install()
    report["global_hooks"] = hooks_now.global_hooks
    report["held_steps"] = hooks_now.held_steps
    report["steps"] = stepped(early, early)
    scheduler.step()  # the scheduler still sees its own wrapper (no "overridden" warning)
    report["updated_is_the_optimizer"] = updated == [early, early]
    hooks_now.uninstall()
    held = vars(early)["step"]
    report["held_step_restored"] = getattr(held, "_wrapped_by_lr_sched", False) and not hasattr(
        held, "__traceml_original__")
    gone = weakref.ref(early)
    gc.disable()  # our wrapper held it weakly, as the scheduler does: freed without a collection
    del early, scheduler, updated, hooks_now, held
    report["freed_without_gc"] = gone() is None
    gc.enable()
    json.dump(report, sys.stdout)
    sys.exit(0)

first = hooks.OptimizerHooks(recorder)
first.install()  # no optimizer exists yet in this process
report["fresh_global_hooks"] = first.global_hooks
early, _scheduler = optimizer()  # its scheduler holds the first hooks' wrapper
report["fresh"] = stepped(early)
first.uninstall()
report["restored"] = not hasattr(torch.optim.SGD.__dict__["step"], "__traceml_original__")
second = hooks.OptimizerHooks(recorder)
second.install()  # SGD was used before and not every optimizer is known: the global hooks
report["late_global_hooks"] = second.global_hooks
late, _late_scheduler = optimizer()
report["late"] = stepped(early, late)  # the old wrapper passes through; the global hooks time it
second.uninstall()
json.dump(report, sys.stdout)
