"""Which loader is the training loader (capture/training_loader.py), on the recorder itself: only the
training loader's fetches between steps are input wait, whatever no_grad or eval() say; a new
training loader, two loaders zipped and a tentative step on an evaluation loader's batch."""

from __future__ import annotations

from time import perf_counter_ns

from tests.capture.test_recorder import ListSink
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.wire.step_row import decode_step

TRAIN, VALIDATION, OTHER = 101, 202, 303


def fetch(recorder: StepRecorder, source: int | None, took_ns: int = 1_000_000, fetched: bool = True) -> None:
    recorder.fetch_end((perf_counter_ns() - took_ns, None), 8, fetched, source)


def step(recorder: StepRecorder) -> None:
    with recorder:
        pass


def rows(recorder: StepRecorder, sink: ListSink) -> list:
    recorder.flush()
    return [decode_step(row, 0) for batch in sink.batches for row in batch]


def test_only_the_training_loaders_fetches_are_input_wait() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink)
    fetch(recorder, TRAIN)
    step(recorder)  # the loader a step begins with is the training loader
    for _ in range(3):  # a validation pass with grad on and the model in train(): its loader tells it
        fetch(recorder, VALIDATION, 50_000_000)
        recorder.forward_between_steps(True)
    fetch(recorder, VALIDATION, 50_000_000, fetched=False)  # the loop's end
    fetch(recorder, TRAIN)
    step(recorder)
    first, second = rows(recorder, sink)
    assert first.input_fetches == 1 and second.input_fetches == 1
    assert second.input_wait_ns < 50_000_000
    assert recorder.loaders.training == {TRAIN} and recorder.loaders.evaluation == {VALIDATION}
    assert recorder.loaders.dropped_fetches == 4


def test_two_loaders_zipped_both_feed_the_step_and_a_new_loader_takes_over() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink)
    fetch(recorder, TRAIN)
    fetch(recorder, OTHER)
    step(recorder)
    fetch(recorder, TRAIN)
    fetch(recorder, OTHER)
    step(recorder)
    fetch(recorder, VALIDATION)  # a second training phase on a new loader (no forward between steps)
    step(recorder)
    first, second, third = rows(recorder, sink)
    assert (first.input_fetches, second.input_fetches, third.input_fetches) == (2, 2, 1)
    assert recorder.loaders.training == {TRAIN, OTHER, VALIDATION}


def test_a_tentative_step_on_a_new_loaders_batch_is_cancelled_when_it_fetches_before_a_backward() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink)
    fetch(recorder, TRAIN)
    step(recorder)
    fetch(recorder, VALIDATION, 50_000_000)
    assert recorder.last_batch() == "unknown"
    assert recorder.open_tentatively(None)  # step inference: a grad-enabled forward on that batch
    fetch(recorder, VALIDATION, 50_000_000)  # the next validation batch, no backward: evaluation
    assert not recorder.in_step and recorder.last_batch() == "evaluation"
    recorder.forward_between_steps(True)
    fetch(recorder, TRAIN)
    assert recorder.last_batch() is None
    step(recorder)
    steps = rows(recorder, sink)
    assert len(steps) == 2 and steps[1].input_fetches == 1 and steps[1].input_wait_ns < 50_000_000
    assert VALIDATION in recorder.loaders.evaluation and VALIDATION not in recorder.loaders.training


def test_a_tentative_step_with_a_backward_is_a_new_training_loader() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink)
    fetch(recorder, TRAIN)
    step(recorder)
    fetch(recorder, OTHER)
    assert recorder.open_tentatively(None)
    recorder.phase_done("backward", recorder.phase_begin())
    fetch(recorder, OTHER)  # accumulation's next micro-batch, inside the step
    assert recorder.in_step
    recorder.end_step()
    steps = rows(recorder, sink)
    assert len(steps) == 2 and steps[1].input_fetches == 2 and steps[1].input_wait_in_step_ns
    assert OTHER in recorder.loaders.training


def test_a_wrapped_loader_is_the_training_loader() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink)
    fetch(recorder, None)  # wrap_dataloader: no source, declared training
    recorder.forward_between_steps(True)
    fetch(recorder, None)
    step(recorder)
    (row,) = rows(recorder, sink)
    assert row.input_fetches == 2
