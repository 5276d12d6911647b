"""Optimizer steps counted once whether or not an optimizer predates the hooks (a fresh process).

Prints one JSON line: for each stage, whether torch's global step hooks were registered and the
optimizer phases and updates recorded per step.
"""

import json
import sys

import torch
from torch import nn

from tests.capture.list_sink import ListSink
from traceml_otel.capture import hooks
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
first = hooks.OptimizerHooks(recorder)
first.install()  # no optimizer exists yet in this process
report["fresh_global_hooks"] = first.global_hooks
early, _scheduler = optimizer()  # its scheduler holds the first hooks' wrapper
report["fresh"] = stepped(early)
first.uninstall()
report["restored"] = not hasattr(torch.optim.SGD.__dict__["step"], "__traceml_original__")
second = hooks.OptimizerHooks(recorder)
second.install()  # SGD was used before: an instance may hold an old step
report["late_global_hooks"] = second.global_hooks
late, _late_scheduler = optimizer()
report["late"] = stepped(early, late)  # the old wrapper passes through; the global hooks time it
second.uninstall()
json.dump(report, sys.stdout)
