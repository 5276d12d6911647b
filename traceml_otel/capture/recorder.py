"""The hot path: clock readings for steps, phases and input fetches (the phase and collective calls
inside a step: :mod:`traceml_otel.capture.step_calls`, a base of :class:`StepRecorder`).

Everything here runs on the training thread. It reads ``perf_counter_ns`` (and, on
CUDA, records an event), appends to lists, and every ``flush_steps`` steps or
``flush_interval_ns`` hands a batch of step rows (:mod:`traceml_otel.wire.step_row`) to the
sink. It builds no OTel objects, never blocks on the device and never raises into training.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from threading import get_ident, get_native_id
from time import perf_counter_ns
from typing import Any

from traceml_otel.capture.device_clock import CpuClock
from traceml_otel.capture.step_calls import StepCalls
from traceml_otel.capture.step_state import OpenStep, StepSink, StepState
from traceml_otel.capture.training_loader import TrainingLoader


class StepRecorder(StepCalls):
    """Collects one rank's step timings and hands them off in batches (the phase and collective calls
    inside a step: :class:`~traceml_otel.capture.step_calls.StepCalls`)."""

    def __init__(
        self,
        sink: StepSink,
        clock: CpuClock | None = None,
        *,
        flush_steps: int = 256,
        flush_interval_ns: int = 250_000_000,
    ) -> None:
        self.sink = sink
        self.clock = clock or CpuClock()
        """Fixed at construction (``device`` below follows it)."""
        self.device = self.clock.has_device
        """The clock marks device work: without one, no marks are made or released."""
        self._reads_memory = self.device or type(self.clock).peak_memory is not CpuClock.peak_memory
        """The clock reports peak memory (a device clock, or one that reports memory without marks)."""
        self.flush_steps = flush_steps
        self.flush_interval_ns = flush_interval_ns
        self.parallelism = "none"
        self.on_nested_phase: Any = None
        """Called after a phase ends inside an open optimizer call (a closure's forward/backward)."""
        self.after_fetch: Any = None
        """Called after a fetch counted as input wait (step inference: the next step may start here)."""
        self.source = "trace_step"
        """How steps are found (``traceml.step.source``): set by the framework callbacks and inference."""
        self._last_end_ns: int | None = None
        self._outside_since = 0
        self._outside_ns = 0
        self.step = 0
        self.in_step = False
        self.state = StepState()
        """The open step's readings (refilled at each step)."""
        self._wait_ns: int | None = None
        self._fetches = 0
        self._wait_marks: list[tuple[Any, Any]] = []
        self._prefetch_h2d_ns: int | None = None
        self._samples: int | None = None
        self._fetched_samples: int | None = None
        """The count of the last batch fetched outside a step (kept for a pre-fetching loader's last step)."""
        self._loader_seen: Any = None
        self._loader_pending: list[Any] | None = None
        self.nested_steps = 0
        self.owner: int | None = None
        """The training thread (``threading.get_ident``): the first to open a step. One per process."""
        self.other_thread_steps = 0
        """``trace_step`` blocks opened on another thread: ignored, never merged into the owner's steps."""
        self.other_thread_phases = 0
        """Phase calls on another thread while a step was open: ignored for the same reason."""
        self.outside: list[str] = []
        """What runs between steps now (``outside_step`` blocks, innermost last): evaluation, a checkpoint.
        Fetches made inside are no step's input wait."""
        self.outside_fetches = 0
        """Fetches made inside ``outside_step`` blocks (not input wait of any step)."""
        self.loaders = TrainingLoader()
        """Which loaders are the training loader's (``capture/training_loader.py``)."""
        self._training_sources = self.loaders.training
        self._held = self.loaders.held
        self._tentative: Any = None
        """(loader, step number) of a step inference opened on a batch of a loader seen for the first
        time (left in place when the step ends: the step number tells)."""
        self._pending: collections.deque[OpenStep] = collections.deque()
        self._ready: list[list[Any]] = []
        self._queued = 0
        """Steps closed and not yet handed to the sink (``_ready`` plus ``_pending``)."""
        self._last_flush_ns = perf_counter_ns()
        self._device_sent: tuple[int, str | None] | None = None
        self._nested_blocks = 0
        """Blocks entered (as a context manager) inside an open step and not yet exited."""
        self.on_refused: Callable[[str], None] | None = None
        """Called with ``"thread"`` or ``"nested"`` when a block opens no step (the session warns)."""
        self.on_owner: Callable[[int], None] | None = None
        """Called once, with the kernel thread id, when the first step names the training thread."""
        self.on_internal_error: Callable[[], None] | None = None
        """Called when a block's own code raised (the session counts it and warns once)."""

    # --- trace_step's usual block ------------------------------------------------------
    def __enter__(self) -> None:
        """Open a step: ``trace_step()``'s usual block (the traced model, no declared work) is this
        recorder itself, so a step costs two Python calls here instead of a context object and the
        session's and recorder's ``begin_step`` (:meth:`begin_step`'s checks, inline). A block inside an
        open step, or on a thread other than the training thread, opens nothing (counted; the
        session's ``on_refused`` warns once)."""
        try:
            thread = get_ident()
            owner = self.owner
            if owner is None:
                self.owner = thread
                if self.on_owner is not None:
                    self.on_owner(get_native_id())
            elif thread != owner:
                self.other_thread_steps += 1
                if self.on_refused is not None:
                    self.on_refused("thread")
                return
            if self.in_step:
                self.nested_steps += 1
                self._nested_blocks += 1
                if self.on_refused is not None:
                    self.on_refused("nested")
                return
            if self._held:  # fetches of a loader not yet known as the training one
                self._take_held()
            if self._reads_memory:
                self.clock.reset_peak_memory()
            self.state.begin(perf_counter_ns(), self.clock.mark() if self.device else None, None, None)
            self.in_step = True
        except Exception:
            if self.on_internal_error is not None:
                self.on_internal_error()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        """Close the step :meth:`__enter__` opened (a refused block closes nothing); exceptions pass."""
        try:
            if get_ident() != self.owner:
                return False
            if self._nested_blocks:
                self._nested_blocks -= 1
                return False
            self.end_step(None if exc_type is None else exc_type.__name__)
        except Exception:
            if self.on_internal_error is not None:
                self.on_internal_error()
        return False

    def step_started_ns(self) -> int:
        """``perf_counter_ns`` when the open (or last) step began (read by the hang watchdog)."""
        return self.state.start_ns

    # --- input fetches ---------------------------------------------------------
    def fetch_begin(self) -> tuple[int, Any]:
        """Mark the start of a ``next()`` on the data loader."""
        return perf_counter_ns(), (self.clock.mark() if self.device else None)

    def fetch_end(self, token: tuple[int, Any], samples: int | None = None, fetched: bool = True,
                  source: Any = None) -> None:
        """A fetch outside a step is input wait of the next step; inside one it is input wait of that
        step, kept apart (``StepRow.input_wait_in_step_ns``: its time is inside the block too).

        ``samples`` (the batch dimension) counts toward the step: outside a step the last fetch
        before it (an evaluation loop or a second loader in between must not add up); inside a step
        every fetch (micro-batches). A fetch inside an ``outside_step`` block (evaluation) counts
        toward no step. ``fetched`` is False when the fetch returned no batch (the iterator was exhausted
        or raised). A pre-fetching loader (Accelerate's) fetches batch k+1 before it yields batch k, so its
        last step follows such a fetch: that step keeps the count of the last batch fetched.
        ``source`` (the loader's dataset's ``id``; ``None``: a loader the user wrapped): a fetch between
        steps from a loader not known as the training one is held apart (``capture/training_loader.py``).
        """
        end = perf_counter_ns()
        owner = self.owner
        if owner is not None and get_ident() != owner:  # another thread's loader: no step's wait
            self.clock.release(token[1])
            return
        if (self.in_step or self.outside) and (self._tentative is None or not self._tentative_cancelled()):
            if self.device:
                self.clock.release(token[1])
            if not self.in_step:
                self.outside_fetches += 1
                return
            state = self.state  # a fetch inside the step (a micro-batch): that step's input wait too
            state.fetch_ns += end - token[0]
            self._fetches += 1
            if samples is not None:
                state.samples = samples if state.samples is None else state.samples + samples
            return
        if source is not None and source not in self._training_sources:
            self._hold(token, end, samples, fetched, source)
            return
        if self._held:  # a training batch came after the held ones
            self.loaders.last = None
        if not fetched:
            samples = self._fetched_samples
        self._samples = self._fetched_samples = samples
        self._wait_ns = (self._wait_ns or 0) + end - token[0]
        self._fetches += 1
        if self.device:  # the fetch's device time, from a mark at each end
            self._wait_marks.append((token[1], self.clock.mark()))
        if fetched and self.after_fetch is not None:  # not an exhausted iterator's StopIteration
            self.after_fetch(end)

    def _hold(self, token: tuple[int, Any], end: int, samples: int | None, fetched: bool,
              source: Any) -> None:
        """A fetch between steps from a loader not known as the training one: held apart."""
        if self.device:
            self.clock.release(token[1])
        if self.loaders.hold(source, end - token[0], samples, fetched) and self.after_fetch is not None:
            self.after_fetch(end)

    def _take_held(self) -> None:
        """A step begins: the held fetches that fed it are its input wait (``TrainingLoader.take``)."""
        wait, fetches, samples = self.loaders.take(self._fetches > 0)
        if fetches:
            self._wait_ns = (self._wait_ns or 0) + wait
            self._fetches += fetches
            if self._samples is None:
                self._samples = self._fetched_samples = samples

    def last_batch(self) -> str | None:
        """Whose batch a forward between steps uses (``TrainingLoader.last_batch``): ``"evaluation"``
        (step inference opens no step for it), ``"unknown"`` (a tentative step) or ``None``."""
        return None if self.in_step else self.loaders.last_batch()

    def open_tentatively(self, start_ns: int | None) -> bool:
        """Step inference opens a step on the batch of a loader seen for the first time: if the step
        fetches again before any backward, it was evaluation (:meth:`_tentative_cancelled`)."""
        source = self.loaders.last
        if not self.begin_step(start_ns=start_ns):
            return False
        self._tentative = source, self.step
        return True

    def _tentative_cancelled(self) -> bool:
        """A fetch inside a tentative step: with no backward yet, the step was an evaluation forward on
        another loader's batch; it is cancelled (its wait forgotten) and the fetch is between steps."""
        (source, step), self._tentative = self._tentative, None
        if step != self.step or not self.in_step or any(p[0] == "backward" for p in self.state.phases):
            return False  # a new training loader (or that step ended): the step goes on
        self.cancel_step()
        self.discard_input_wait()
        self.loaders.not_training(source)
        return True

    def forward_between_steps(self, training: bool) -> None:
        """A model's forward ran between steps: the fetches held apart fed it (evaluation), and under
        ``eval()``/``no_grad`` (``training`` False) so did the training loader's since the last step."""
        if self.in_step:
            return
        self.loaders.forward_between_steps()
        if not training:
            self.discard_input_wait()

    def add_prefetch_h2d(self, duration_ns: int) -> None:
        """A host-to-device copy the data loader made between steps (Accelerate's prepared loaders).

        It belongs to the next step, beside its input wait: neither the fetch nor the block timed it.
        """
        if not self.in_step and not self.outside:
            self._prefetch_h2d_ns = (self._prefetch_h2d_ns or 0) + duration_ns

    def loader_seen(self, settings: tuple[Any, ...], source: Any = None) -> None:
        """A DataLoader iterator started; its settings go out once, with the next step, when they changed.

        An evaluation loader started inside an ``outside_step`` block, or another loader than the
        training one once that is known (``source``: see :meth:`fetch_end`), is ignored.
        """
        training = self._training_sources
        if source is not None and training and source not in training:
            return
        if settings != self._loader_seen and not self.outside:
            self._loader_seen = settings
            self._loader_pending = list(settings)

    def enter_outside(self, kind: str) -> None:
        """Evaluation, a checkpoint or other work between steps starts: its fetches feed no step."""
        if not self.outside:
            self._outside_since = perf_counter_ns()
        self.outside.append(kind)

    def exit_outside(self) -> None:
        """The innermost ``enter_outside`` block ends."""
        if self.outside:
            self.outside.pop()
            if not self.outside and not self.in_step:
                self._outside_ns += perf_counter_ns() - self._outside_since

    def discard_input_wait(self) -> None:
        """Forget the fetches since the last step: they fed evaluation, not the next training step."""
        if self.in_step:
            return
        for begin, end in self._wait_marks:
            self.clock.release(begin)
            self.clock.release(end)
        self._wait_ns = None
        self._fetches = 0
        self._wait_marks = []
        self._prefetch_h2d_ns = None
        self._samples = self._fetched_samples = None
        self.loaders.discard()  # the fetches held apart per loader too

    @property
    def last_step_end_ns(self) -> int | None:
        """``perf_counter_ns`` at the end of the last step (``None`` before the first)."""
        return self._last_end_ns

    # --- steps -------------------------------------------------------------------
    def begin_step(
        self, samples: int | None = None, tokens: int | None = None, start_ns: int | None = None
    ) -> bool:
        """Open a step; ``samples``/``tokens`` are the work the caller declared for it. ``start_ns``
        (step inference) dates its start back to an earlier clock reading (the end of a fetch).

        A ``trace_step`` inside an open one is not a step: it is counted in ``nested_steps``, and
        False is returned (its ``end_step`` must then be skipped). One thread trains: a block opened
        on another thread than the first one's is counted in ``other_thread_steps`` and refused too.
        """
        thread = get_ident()
        if self.owner is None:
            self.owner = thread
            if self.on_owner is not None:
                try:
                    self.on_owner(get_native_id())
                except Exception:
                    if self.on_internal_error is not None:
                        self.on_internal_error()
        elif thread != self.owner:
            self.other_thread_steps += 1
            return False
        if self.in_step:
            self.nested_steps += 1
            return False
        if self._held:
            self._take_held()
        if self._reads_memory:
            self.clock.reset_peak_memory()
        start_mark = self.clock.mark() if self.device else None
        self.state.begin(perf_counter_ns() if start_ns is None else start_ns, start_mark, samples, tokens)
        self.in_step = True
        return True

    def cancel_step(self) -> None:
        """Drop the open step without recording it (an inferred step that explicit steps replace)."""
        if self.in_step:
            state = self.state
            for mark in (state.start_mark, *(m for pair in state.phase_marks for m in pair)):
                self.clock.release(mark)
            self.in_step = False
            self.state = StepState()

    def end_step(self, exception_type: str | None = None) -> None:
        """Close the step and queue it; flush a batch when one is due."""
        end_ns = perf_counter_ns()
        if not self.in_step:
            return
        state = self.state
        self.in_step = False
        end_mark = self.clock.mark() if self.device else None
        memory = self.clock.peak_memory() if self._reads_memory else None
        if memory is None:
            alloc = reserved = total = None
        else:
            alloc, reserved, total = memory
        samples = state.given_samples
        if samples is None and (self._samples is not None or state.samples is not None):
            samples = (self._samples or 0) + (state.samples or 0)
        last_end = self._last_end_ns
        between = None
        if last_end is not None:
            between = state.start_ns - last_end - self._outside_ns
            if between < 0:
                between = 0
        # A plain list in the schema's wire order (wire/step_schema.py), positionally: StepRow.of's
        # keyword call would cost about 1 us more, a StepRow 0.4 us more than the list
        # (tests/wire/test_step_row.py checks each value lands in its slot).
        row = [
            self.step, state.start_ns, end_ns, None, self._wait_ns, None, self._fetches,
            self._prefetch_h2d_ns, state.optimizer_steps, self.parallelism, alloc, reserved,
            total, exception_type, state.phases, state.collectives, samples, state.tokens,
            self._loader_pending, self.source, between, state.fetch_ns, state.skipped_updates,
        ]
        self._last_end_ns = end_ns
        self._outside_ns = 0
        self._samples = None
        self._loader_pending = None
        if self.device:
            self._pending.append(OpenStep(
                row, state.start_mark, end_mark, state.phase_marks, self._wait_marks, state.collective_marks
            ))
            self._wait_marks = []
        else:
            self._ready.append(row)  # (no device: _wait_marks stays empty)
        self.step += 1
        self._wait_ns = None
        self._fetches = 0
        self._prefetch_h2d_ns = None
        self._queued += 1
        if (
            self._queued >= self.flush_steps
            or end_ns - self._last_flush_ns >= self.flush_interval_ns
        ):
            self.flush()

    def flush(self, wait_s: float = 0.0) -> None:
        """Resolve finished device marks and hand ready steps to the sink.

        With ``wait_s`` > 0 (shutdown only) it polls the device for the last steps.
        """
        self._last_flush_ns = perf_counter_ns()
        while self._pending:
            open_step = self._pending[0]
            done = self.clock.is_done(open_step.end_mark) or (
                wait_s > 0 and self.clock.wait(open_step.end_mark, wait_s)
            )
            # A collective's completion event may sit on a communication stream, after the step's end.
            done = done and all(
                end is None or self.clock.is_done(end) or (wait_s > 0 and self.clock.wait(end, wait_s))
                for _, end in open_step.collective_marks
            )
            if not done:
                break
            self._pending.popleft()
            self._ready.append(open_step.resolve(self.clock))
        self._queued = len(self._pending)
        if self._ready:
            rows, self._ready = self._ready, []
            self.sink.send_steps(rows)
        if self.clock.has_device:
            self._report_device()

    def _report_device(self) -> None:
        """Tell the sink which CUDA device this rank uses, when it is first known or changes."""
        identity = self.clock.device_identity()
        send = getattr(self.sink, "send_device", None)
        if identity is not None and identity != self._device_sent and send is not None:
            self._device_sent = identity
            send(identity[0], identity[1])

    @property
    def unresolved_steps(self) -> int:
        """Steps whose device work had not finished at the last flush."""
        return len(self._pending)
