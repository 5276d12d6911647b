"""``trace_step(model)``'s usual block is the recorder itself (two Python calls a step, no context object).

The recorder's ``__enter__``/``__exit__`` must do what the session's full path does: one step per
outermost block, nested blocks and other threads' blocks opening nothing (counted, warned once through
the session), an exception leaving the block recorded and passed on, an internal error counted instead
of raised into training. ``trace_step`` hands the recorder out only for the model a step was last opened
for through the session, never while step inference runs or after shutdown.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.capture.list_sink import ListSink
from tests.capture.test_work_capture import _python
from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.capture.recorder import StepRecorder


def _recorder() -> tuple[ListSink, StepRecorder, list[str], list[int]]:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    refused: list[str] = []
    errors: list[int] = []
    recorder.on_refused = refused.append
    recorder.on_internal_error = lambda: errors.append(1)
    return sink, recorder, refused, errors


def test_blocks_open_and_close_steps_and_nested_blocks_open_nothing() -> None:
    sink, recorder, refused, errors = _recorder()
    for _ in range(3):
        with recorder:
            with recorder:  # a helper that traces its own step, inside the user's
                with recorder:
                    assert recorder.in_step
            assert recorder.in_step  # the inner blocks' exits did not end the outer step
        assert not recorder.in_step
    recorder.flush()
    assert [record.step for record in sink.records()] == [0, 1, 2]
    assert recorder.nested_steps == 6 and refused == ["nested"] * 6 and errors == []


def test_an_exception_leaves_the_block_recorded_and_passes_on() -> None:
    sink, recorder, _, _ = _recorder()
    with pytest.raises(KeyError), recorder:
        raise KeyError("user's")
    recorder.flush()
    (record,) = sink.records()
    assert record.exception_type == "KeyError"


def test_another_threads_block_opens_and_closes_nothing() -> None:
    sink, recorder, refused, _ = _recorder()
    with recorder:
        pass  # the first block's thread is the training thread
    inside = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with recorder:
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with recorder:  # the training thread's step is open while the other thread's block enters and exits
        thread.start()
        assert inside.wait(10)
        leave.set()
        thread.join(10)
        assert recorder.in_step  # its exit did not end our step
    recorder.flush()
    assert [record.step for record in sink.records()] == [0, 1]
    assert recorder.other_thread_steps == 1 and refused == ["thread"]


def test_an_internal_error_is_counted_not_raised() -> None:
    sink, recorder, _, errors = _recorder()

    def broken() -> None:
        raise RuntimeError("device clock failed")

    recorder._reads_memory = True
    recorder.clock.reset_peak_memory = broken  # type: ignore[method-assign]
    with recorder:
        value = 1  # training goes on
    assert value == 1 and errors == [1] and not recorder.in_step
    recorder.flush()
    assert sink.rows == []  # the step that could not open is not recorded


def test_trace_step_hands_out_the_recorder_only_on_the_sessions_usual_path(tmp_path: Path) -> None:
    result = _python("""
        import torch
        import traceml_otel as traceml
        from traceml_otel.capture.recorder import StepRecorder
        from traceml_otel.capture.session import current
        traceml.init()
        first, second = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        kinds = []

        def step(model, **work):
            block = traceml.trace_step(model, **work)
            kinds.append("recorder" if isinstance(block, StepRecorder) else "context")
            with block:
                model(torch.zeros(2, 4)).sum().backward()

        step(first); step(first); step(first)  # the first opens through the session, then the recorder
        step(second); step(second)  # another model: the session sees it first
        step(first, samples=2); step(first)  # declared work: the session's path, then the usual one
        print("KINDS", " ".join(kinds))
        import os
        child = os.fork()  # a DataLoader worker's fork: the child never records into the parent's recorder
        if child == 0:
            os._exit(3 if isinstance(traceml.trace_step(first), StepRecorder) else 0)
        print("CHILD", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
        traceml.shutdown()
        block = traceml.trace_step(first)
        print("AFTER", "recorder" if isinstance(block, StepRecorder) else "context")
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    kinds = "KINDS context recorder recorder context recorder context recorder"
    assert kinds in result.stdout, result.stdout
    assert "AFTER context" in result.stdout and "CHILD 0" in result.stdout, result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    steps = [s for s in spans if s.name == c.SPAN_STEP]
    assert sorted(s.attributes[c.ATTR_STEP] for s in steps) == list(range(7))
    forward = c.PHASE_SPAN_NAMES["forward"]
    assert sum(s.name == forward for s in spans) == 7  # both models' forwards, every step


def test_step_inference_keeps_trace_step_on_the_sessions_path(tmp_path: Path) -> None:
    result = _python("""
        import torch
        import traceml_otel as traceml
        from traceml_otel.capture.recorder import StepRecorder
        from traceml_otel.capture.session import current
        traceml.init()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        session = current()
        print("INFERRING", session.start_inference() is not None)
        kinds = []
        for _ in range(3):
            block = traceml.trace_step(model)
            kinds.append("recorder" if isinstance(block, StepRecorder) else "context")
            with block:
                model(torch.zeros(2, 4)).sum().backward()
                optimizer.step()
        print("KINDS", " ".join(kinds), "INFERRED-AFTER", session.inferred is not None)
        traceml.shutdown()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "INFERRING True" in result.stdout, result.stdout
    # the first explicit block stops the inference through the session; then the recorder is the block
    assert "KINDS context recorder recorder INFERRED-AFTER False" in result.stdout, result.stdout
