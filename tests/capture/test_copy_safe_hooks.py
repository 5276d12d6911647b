"""A user's copies of traced objects: ``copy.deepcopy`` and whole-object pickles work, the copies are
not traced and carry no capture state (nothing of ours when the class's call times the model; no-op
hooks when hooks do, as for step inference's roots), and the originals stay traced.

The zero-code side (a copy of the inferred root, made mid-run, called in train mode inside a step) is
in ``tests/zero_code/scripts/plain_loop.py``, checked by ``test_auto_env.py``.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from tests.capture.list_sink import ListSink
from traceml_otel.capture import hooks
from traceml_otel.capture.copy_safe import INERT_HOOK
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.capture.wrappers import watch_optimizer


@pytest.fixture(params=[True, False], ids=["by_call", "by_hooks"])
def traced(request):
    """A model timed as ``trace_step(model)`` times it (by its class's call), or as step inference
    does (by hooks), with one traced step already run."""
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    forward = hooks.ForwardHooks(recorder)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    forward.watch(model, by_call=request.param)
    assert bool(model._forward_hooks) is not request.param
    recorder.begin_step()
    model(torch.ones(2, 4))
    recorder.end_step()
    yield sink, recorder, model
    forward.uninstall()


def _copied_hooks(copy_of_model: nn.Module, original: nn.Module) -> list:
    """What a copy carries where the original has hooks: no-op hooks, or nothing when it has none."""
    expected = [INERT_HOOK] if original._forward_hooks else []
    assert list(copy_of_model._forward_pre_hooks.values()) == expected
    return list(copy_of_model._forward_hooks.values()) == expected


def _forwards(record) -> int:
    return [p.phase for p in record.phases].count("forward")


def test_a_deep_copy_is_not_traced_and_the_original_still_is(traced) -> None:
    sink, recorder, model = traced
    ema = copy.deepcopy(model)
    assert _copied_hooks(ema, model)
    x = torch.ones(2, 4)
    recorder.begin_step()  # the original and its copy in one step: one forward
    model(x)
    ema(x)
    recorder.end_step()
    recorder.begin_step()  # the copy alone (EMA update, teacher forward): no forward
    assert torch.equal(ema(x), model[2](model[1](model[0](x))))
    recorder.end_step()
    recorder.begin_step()  # the original after the copy: still traced
    model(x)
    recorder.end_step()
    recorder.flush()
    assert [_forwards(r) for r in sink.records()] == [1, 1, 0, 1]


def test_copies_of_modules_holding_a_traced_model(traced) -> None:
    sink, recorder, model = traced
    averaged = torch.optim.swa_utils.AveragedModel(model)  # deep-copies the model inside
    teacher = copy.deepcopy(nn.ModuleDict({"student": model}))["student"]
    recorder.begin_step()
    averaged(torch.ones(2, 4))
    teacher(torch.ones(2, 4))
    averaged.update_parameters(model)
    recorder.end_step()
    recorder.flush()
    assert [_forwards(r) for r in sink.records()] == [1, 0]


def test_whole_model_pickle_round_trip_needs_no_traceml(traced) -> None:
    _, _, model = traced
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert b"traceml" not in buffer.getvalue()  # loading needs nothing of ours installed
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert _copied_hooks(loaded, model)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    again = pickle.loads(pickle.dumps(model))
    assert _copied_hooks(again, model)
    assert copy.deepcopy(again)(x).shape == (3, 2)


def test_a_copied_optimizer_is_not_traced_and_the_original_still_is() -> None:
    """torch copies and pickles an optimizer without its hooks (``Optimizer.__getstate__``), so
    ``wrap_optimizer``'s per-optimizer hooks need nothing of their own; this holds torch to it."""
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    optimizer_hooks = hooks.OptimizerHooks(recorder)  # not installed: wrap_optimizer's per-optimizer hooks
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    watch_optimizer(optimizer, optimizer_hooks.pre, optimizer_hooks.post)  # as the session passes them
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    snapshot = copy.deepcopy(optimizer)
    assert b"traceml" not in pickle.dumps(optimizer)
    recorder.begin_step()
    snapshot.step()
    recorder.end_step()
    recorder.begin_step()
    optimizer.step()
    recorder.end_step()
    recorder.flush()
    assert [[p.phase for p in r.phases] for r in sink.records()] == [[], ["optimizer"]]
    assert [r.optimizer_steps for r in sink.records()] == [0, 1]
