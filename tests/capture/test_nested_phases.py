"""A forward/backward inside ``optimizer.step(closure)`` counts once; evaluation fetches can be dropped."""

from __future__ import annotations

import itertools
import time

import torch
from torch import nn

from tests.capture.test_hooks import ListSink
from traceml_otel.capture import hooks
from traceml_otel.capture.recorder import StepRecorder


def test_closure_phases_are_their_own_and_the_optimizer_span_follows_them() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    installed = [hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder)]
    for hook in installed:
        hook.install()
    forward = hooks.ForwardHooks(recorder)
    model = nn.Linear(8, 1)
    forward.watch(model)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)
    x, y = torch.randn(16, 8), torch.randn(16, 1)

    def closure() -> torch.Tensor:  # what Lightning passes to step(): forward and backward inside it
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        time.sleep(0.002)
        return loss

    try:
        recorder.begin_step()
        optimizer.step(closure)
        recorder.end_step()
        recorder.flush()
    finally:
        for hook in installed:
            hook.uninstall()
        forward.uninstall()
    (record,) = sink.records()
    phases = sorted(record.phases, key=lambda p: p.start_ns)
    names = [p.phase for p in phases]
    assert names.count("optimizer") == 1 and record.optimizer_steps == 1
    assert names.count("forward") >= 1 and names.count("forward") == names.count("backward")
    for before, after in itertools.pairwise(phases):  # no time counted twice
        assert before.end_ns <= after.start_ns, (before.phase, after.phase)
    (optimizer_phase,) = [p for p in phases if p.phase == "optimizer"]
    last_backward = max(p.end_ns for p in phases if p.phase == "backward")
    assert optimizer_phase.start_ns >= last_backward  # restarted after the closure's last phase
    assert recorder.on_nested_phase is None  # nothing left armed after the call


def test_discarded_input_wait_is_not_the_next_steps() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    fetches = hooks.DataLoaderPatch(recorder)
    fetches.install()
    try:
        loader = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
        evaluation = iter(loader)
        next(evaluation)  # evaluation between two training steps
        next(evaluation)
        recorder.discard_input_wait()
        train = iter(loader)
        next(train)
        recorder.begin_step()
        recorder.discard_input_wait()  # inside a step: ignored
        recorder.end_step()
        recorder.flush()
    finally:
        fetches.uninstall()
    (record,) = sink.records()
    assert record.input_fetches == 1
