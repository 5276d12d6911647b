"""Forward timing by the traced model's class call (``ForwardHooks.watch``'s default).

The class's ``__call__`` is wrapped once; only the traced objects are timed, every other instance of the
class passes through; torch keeps the module call's fast path (no hooks on the model); ``uninstall``
puts each class back as it was; torch's layer classes and step inference's roots take hooks.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch import nn

from tests.capture.list_sink import ListSink
from traceml_otel.capture import hooks
from traceml_otel.capture.recorder import StepRecorder


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Scaled(nn.Module):
    """A class with a ``__call__`` of its own (it must keep running, and come back on uninstall)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


@pytest.fixture
def timing():
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    forward = hooks.ForwardHooks(recorder)
    yield sink, recorder, forward
    forward.uninstall()


def _step(recorder: StepRecorder, *calls) -> None:
    recorder.begin_step()
    for call in calls:
        call()
    recorder.end_step()


def _forwards(sink: ListSink) -> list[int]:
    return [[p.phase for p in record.phases].count("forward") for record in sink.records()]


def test_only_the_traced_instance_is_timed_and_uninstall_restores_the_class(timing) -> None:
    sink, recorder, forward = timing
    traced, other = Net(), Net()
    x = torch.ones(3, 4)
    forward.watch(traced)
    assert "__call__" in Net.__dict__ and not traced._forward_hooks  # the class's call, no hooks
    _step(recorder, lambda: traced(x))
    _step(recorder, lambda: other(x))  # another instance of the class: no forward
    _step(recorder, lambda: traced(x), lambda: traced(x))  # two calls, both kept
    recorder.flush()
    assert _forwards(sink) == [1, 0, 2]
    assert torch.equal(other(x), other.layer(x))  # passed through unchanged
    forward.uninstall()
    assert "__call__" not in Net.__dict__  # inherited again, as before
    assert torch.equal(traced(x), traced.layer(x))


def test_a_class_with_its_own_call_keeps_it(timing) -> None:
    sink, recorder, forward = timing
    own = Scaled.__dict__["__call__"]
    model = Scaled()
    forward.watch(model)
    x = torch.ones(1, 4)
    _step(recorder, lambda: model(x))
    recorder.flush()
    assert _forwards(sink) == [1]
    assert torch.equal(model(x), model.layer(x) * 2)
    forward.uninstall()
    assert Scaled.__dict__["__call__"] is own


def test_torch_layers_and_inferred_roots_take_hooks(timing) -> None:
    sink, recorder, forward = timing
    layer, root = nn.Linear(4, 2), Net()
    forward.watch(layer)
    forward.watch(root, by_call=False)
    assert "__call__" not in nn.Linear.__dict__ and "__call__" not in Net.__dict__
    assert len(layer._forward_hooks) == 1 and len(root._forward_hooks) == 1
    _step(recorder, lambda: layer(torch.ones(1, 4)))
    _step(recorder, lambda: root(torch.ones(1, 4)))
    recorder.flush()
    assert _forwards(sink) == [1, 1]


def test_a_call_from_another_thread_is_untimed_and_counted(timing) -> None:
    sink, recorder, forward = timing
    model = Net()
    forward.watch(model)
    recorder.begin_step()
    worker = threading.Thread(target=model, args=(torch.ones(1, 4),))
    worker.start()
    worker.join()
    model(torch.ones(1, 4))
    recorder.end_step()
    recorder.flush()
    assert _forwards(sink) == [1]
    assert recorder.other_thread_phases == 1


def test_a_collected_model_leaves_no_identity_behind(timing) -> None:
    _, _, forward = timing
    model = Net()
    forward.watch(model)
    assert len(forward._timed) == 1
    del model
    gc.collect()
    assert not forward._timed  # its id may be reused by a new object: that one is not traced


def test_a_class_swapped_in_later_still_times_the_model(timing) -> None:
    """FSDP2's ``fully_shard`` swaps the module's class for a subclass made on the fly."""
    sink, recorder, forward = timing
    model = Net()
    forward.watch(model)
    model.__class__ = type("ShardedNet", (Net,), {})
    _step(recorder, lambda: model(torch.ones(1, 4)))
    recorder.flush()
    assert _forwards(sink) == [1]


def test_the_wrapped_call_pickles_by_value_to_a_pass_through(timing) -> None:
    """cloudpickle and dill pickle a class of ``__main__`` by value, its ``__call__`` with it: every
    cell of the wrapper's closure must pickle, and what loads must time nothing."""
    import pickle
    import types

    sink, recorder, forward = timing
    model = Net()
    forward.watch(model)
    wrapper = Net.__dict__["__call__"]
    cells = [pickle.loads(pickle.dumps(cell.cell_contents)) for cell in wrapper.__closure__]
    assert "_thread.lock" not in repr(cells)
    loaded = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, None,
                                tuple(types.CellType(value) for value in cells))
    recorder.begin_step()
    assert torch.equal(loaded(model, torch.ones(1, 4)), model.layer(torch.ones(1, 4)))  # passed through
    recorder.end_step()
    recorder.flush()
    assert _forwards(sink) == [0]


def test_an_inferred_root_runs_its_start_before_the_clock_and_keeps_timing_when_it_goes(timing) -> None:
    """Step inference's roots: the class's call runs the root's start first (it opens the step, so
    the forward falls inside it), replacing the warm-up's hooks; removing the start keeps the timing."""
    sink, recorder, forward = timing
    root, layer = Net(), nn.Linear(4, 2)
    forward.watch(root, by_call=False)  # the warm-up hooked it
    started: list[nn.Module] = []

    def start(module: nn.Module) -> None:
        started.append(module)
        recorder.begin_step()

    handle = forward.watch_root(root, start)
    assert handle is not None and not root._forward_hooks and not root._forward_pre_hooks
    assert forward.watch_root(layer, start) is None  # a torch layer class: the caller hooks it
    root(torch.ones(1, 4))
    recorder.end_step()
    handle.remove()  # inference stopped: the root no longer opens steps, and is still timed
    _step(recorder, lambda: root(torch.ones(1, 4)))
    recorder.flush()
    assert started == [root]
    assert _forwards(sink) == [1, 1]
    first = sink.records()[0]
    assert first.start_ns <= first.phases[0].start_ns  # the step opened before the forward's clock
