"""Scripted TorchScript models (``torch.jit.script``), which take no forward hooks: training goes on.

With ``trace_step(scripted)`` torch refuses our forward hooks. ``ForwardHooks.watch`` then hooks
nothing and says so (the session warns once per model, naming it), every step is still recorded
with its other phases, and a plain ``nn.Module`` around the scripted one is timed as usual.
(Zero-code tracing of such a model: ``tests/zero_code/test_scripted_models.py``.) And a model given to
``trace_step`` compiled (``torch.compile``): no global-hook warning from torch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.capture.list_sink import ListSink
from tests.capture.test_work_capture import _python
from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.capture import hooks, session
from traceml_otel.capture.recorder import StepRecorder


class Wrapper(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_scripted_model_is_stepped_untimed_and_a_plain_wrapper_around_it_is_timed(capsys) -> None:
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    forward, backward = hooks.ForwardHooks(recorder), hooks.BackwardPatch(recorder)
    backward.install()
    wrapper = Wrapper(scripted)
    try:
        refused: list[torch.nn.Module] = []
        forward.watch(scripted, refused.append)
        forward.watch(scripted, refused.append)  # asked once: the refusal is kept
        forward.watch(wrapper, refused.append)
        assert refused == [scripted]
        assert not wrapper._forward_hooks  # timed by its class's call (Wrapper is the user's class)
        for model in (scripted, wrapper):
            recorder.begin_step()
            model(torch.ones(2, 4)).sum().backward()
            recorder.end_step()
        recorder.flush()
    finally:
        backward.uninstall()
        forward.uninstall()
    untimed, timed = sink.records()
    assert [p.phase for p in untimed.phases] == ["backward"]
    assert [p.phase for p in timed.phases] == ["forward", "backward"]
    session._forward_not_timed(scripted)
    warning = capsys.readouterr().err
    assert "the forward of RecursiveScriptModule is not timed" in warning and "trace_step()" in warning


def test_a_model_that_refuses_hooks_is_warned_once_however_often_the_traced_model_changes(
    tmp_path: Path,
) -> None:
    result = _python("""
        import torch
        import traceml_otel as traceml
        traceml.init()
        scripted = torch.jit.script(torch.nn.Linear(4, 2))
        plain = torch.nn.Linear(4, 2)
        for model in [scripted, plain] * 3:  # the traced model changes at every step
            with traceml.trace_step(model):
                model(torch.ones(2, 4)).sum().backward()
        traceml.shutdown()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("the forward of RecursiveScriptModule is not timed") == 1, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    steps = {s.span_id: s.attributes[c.ATTR_STEP] for s in spans if s.name == c.SPAN_STEP}
    forwards = sorted(steps[s.parent_span_id] for s in spans if s.name == "traceml.forward")
    assert sorted(steps.values()) == list(range(6)) and forwards == [1, 3, 5]  # the plain model's


def test_a_traced_module_takes_the_hooks_and_its_forward_is_timed() -> None:
    traced = torch.jit.trace(torch.nn.Linear(4, 2), torch.ones(1, 4))  # unlike a scripted one
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    forward = hooks.ForwardHooks(recorder)
    refused: list[torch.nn.Module] = []
    forward.watch(traced, refused.append)
    assert refused == []
    recorder.begin_step()
    traced(torch.ones(1, 4))
    recorder.end_step()
    recorder.flush()
    forward.uninstall()
    (record,) = sink.records()
    assert [p.phase for p in record.phases] == ["forward"]


def test_step_inference_never_raises_into_the_loop(capsys) -> None:
    """Whatever fails in step inference (here: finding a model's parallelism) is counted and said once;
    the user's forward and optimizer step go on, and the steps are still inferred."""
    from types import SimpleNamespace

    from traceml_otel.capture.inferred_steps import InferredSteps

    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    optimizer_hooks = hooks.OptimizerHooks(recorder)
    optimizer_hooks.install()
    errors = []

    def model_seen(model):
        raise ValueError("a module this code never saw before")

    telemetry = SimpleNamespace(recorder=recorder, forward=None, optimizer_hooks=optimizer_hooks,
                                config=SimpleNamespace(optimizer=True), inferred=None, model_seen=model_seen,
                                internal_errors=0)

    def count_internal_error() -> None:
        errors.append(1)
        telemetry.internal_errors = len(errors)

    telemetry.count_internal_error = count_internal_error
    inferred = InferredSteps(telemetry)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inferred.start()
    try:
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
    finally:
        inferred.stop()
        optimizer_hooks.uninstall()
    recorder.flush()
    assert len(sink.records()) == 4 and errors  # every update a step; the errors counted
    assert capsys.readouterr().err.count("step inference ignored ValueError") == 1


def test_trace_step_of_a_compiled_model_raises_no_global_hook_warning(tmp_path: Path) -> None:
    """``trace_step(torch.compile(model))`` in a fresh process: model discovery's global hooks would be
    in place at the wrapper's first call, where torch warns that global hooks "fire an extra time"
    (pointing at our forward timing); discovery does not start for such a model, its forward is timed."""
    result = _python("""
        import warnings
        import torch
        import traceml_otel as traceml
        warnings.simplefilter("always")
        traceml.init(mode="auto")
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        compiled = torch.compile(model, backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            with traceml.trace_step(compiled):
                optimizer.zero_grad()
                compiled(torch.randn(2, 4)).sum().backward()
                optimizer.step()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "global hooks" not in result.stderr, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    assert sum(s.name == c.SPAN_STEP for s in spans) == 6
    assert sum(s.name == "traceml.forward" for s in spans) == 6  # one timed forward a step, none twice
