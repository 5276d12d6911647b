"""The forward, backward and optimizer hooks record their phase calls as ``phase_done`` records them.

They call ``StepRecorder.phase_done`` (inline copies of its body were folded back: a paired benchmark
showed no gain beyond its A/A control). Held here to the same result on a device clock (fake CUDA
events): the same row layout (``call`` left for the emitter to number), one mark pair per call, the
update counted once, and a call that ends after its step closed releases its start mark and records
nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.capture.test_recorder import FakeEventClock, ListSink
from traceml_otel.capture import hooks
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.wire.step_row import decode_step


class Net(nn.Module):
    """A model class of the user's: its class's call is what the forward hook replaces."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _hooked(clock: FakeEventClock) -> tuple[ListSink, StepRecorder, list, nn.Module, torch.optim.Optimizer]:
    sink = ListSink()
    recorder = StepRecorder(sink, clock, flush_steps=1000)
    installed = [hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder)]
    for hook in installed:
        hook.install()
    forward = hooks.ForwardHooks(recorder)
    installed.append(forward)
    model = Net()
    forward.watch(model)
    assert forward._wrapped_calls, "the model's class call is timed, not module hooks"
    return sink, recorder, installed, model, torch.optim.SGD(model.parameters(), lr=0.1)


def _uninstall(installed: list) -> None:
    for hook in installed:
        hook.uninstall()


def test_the_hooks_record_what_phase_done_records() -> None:
    clock = FakeEventClock()
    sink, recorder, installed, model, optimizer = _hooked(clock)
    try:
        recorder.begin_step()
        for _ in range(2):  # two micro-batches: two forwards, two backwards
            model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        hooked = [list(row) for row in recorder.state.phases]
        hooked_marks = len(recorder.state.phase_marks)
        hooked_updates = recorder.state.optimizer_steps
        recorder.end_step()
    finally:
        _uninstall(installed)

    reference = StepRecorder(ListSink(), FakeEventClock(), flush_steps=1000)
    reference.begin_step()
    for name in ("forward", "backward", "forward", "backward"):
        reference.phase_done(name, reference.phase_begin())
    reference.phase_done("optimizer", reference.phase_begin(), None, True)
    expected = [list(row) for row in reference.state.phases]

    def shape(rows: list) -> list:
        return [[value if i not in (2, 3) else type(value) for i, value in enumerate(row)] for row in rows]

    assert shape(hooked) == shape(expected)
    assert [row[1] for row in hooked] == [None] * 5  # numbered by the emitter, not the training thread
    assert all(row[2] <= row[3] for row in hooked)
    assert hooked_marks == len(reference.state.phase_marks) == 5 and hooked_updates == 1

    clock.complete_all()
    recorder.flush()
    (row,) = sink.batches[0]
    record = decode_step(row, 0)  # numbers the calls, as the emitter does
    assert [(p.phase, p.call) for p in record.phases] == [
        ("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1), ("optimizer", 0)]
    assert all(p.gpu_duration_ns is not None for p in record.phases) and record.optimizer_steps == 1


def test_a_phase_that_ends_after_its_step_releases_its_mark_and_records_nothing() -> None:
    clock = FakeEventClock()
    sink, recorder, installed, model, _ = _hooked(clock)

    def closing_forward(x: torch.Tensor) -> torch.Tensor:
        recorder.end_step()  # the step closes while the forward is still running
        return x.sum()

    model.forward = closing_forward  # type: ignore[method-assign]
    try:
        recorder.begin_step()
        model(torch.ones(2, 4))
    finally:
        _uninstall(installed)
    started = clock.events[1]  # the step's start mark, then the forward's
    assert started in clock.released
    clock.complete_all()
    recorder.flush()
    (row,) = sink.batches[0]
    assert decode_step(row, 0).phases == ()
