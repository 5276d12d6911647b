"""The records the hot path keeps per step: the open step's readings, a finished step waiting
for its device marks, and where finished steps go (:class:`StepSink`).
:mod:`traceml_otel.capture.recorder` fills them on the training thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from traceml_otel.wire.step_row import CollectiveRow, PhaseRow, StepRow

NO_BLOCK = object()
"""``TrainingSession.block_model`` when no step may take the usual block path: the next ``trace_step``
goes through ``Session.begin_step`` (a new model, inference to stop, a deep capture to start)."""


class StepSink(Protocol):
    """Where batches of completed steps go (the emitter channel, or a list in tests).

    A sink may also have ``send_device(index, uuid)``: the recorder then reports the CUDA
    device in use once it is known, and again if it changes (it never initialises CUDA).
    """

    def send_steps(self, rows: list[list[Any]]) -> None:
        """Take a batch of rows in :class:`StepRow`'s layout (plain lists, or StepRows on a device)."""


@dataclass(slots=True)
class OpenStep:
    """A finished step whose device marks may still be in flight."""

    row: list[Any]
    """The step's row in :class:`StepRow`'s layout (a plain list until it is resolved)."""
    start_mark: Any
    end_mark: Any
    phase_marks: list[tuple[Any, Any]]
    wait_marks: list[tuple[Any, Any]]
    collective_marks: list[list[Any]]
    """``[begin, end]`` device marks of each collective (``end`` is set when it completes)."""

    def resolve(self, clock: Any) -> StepRow:
        """The row with its device timings filled in by name, once its marks have completed (every
        mark is released)."""
        row: Any = StepRow(self.row)  # slots made from the schema table: named at run time
        start = self.start_mark
        row.gpu_duration_ns = clock.elapsed_ns(start, self.end_mark)
        phases: list[Any] = [PhaseRow(phase) for phase in row.phases]
        row.phases = phases
        for phase, (begin, end) in zip(phases, self.phase_marks, strict=False):
            phase.gpu_offset_ns = clock.elapsed_ns(start, begin)
            phase.gpu_duration_ns = clock.elapsed_ns(begin, end)
            clock.release(begin)
            clock.release(end)
        for collective, (begin, end) in zip(row.collectives, self.collective_marks, strict=False):
            collective.gpu_offset_ns = clock.elapsed_ns(start, begin)
            collective.gpu_duration_ns = clock.elapsed_ns(begin, end) if end is not None else None
            clock.release(begin)
            clock.release(end)
        if self.wait_marks:
            total = 0
            for begin, end in self.wait_marks:
                total += clock.elapsed_ns(begin, end) or 0
                clock.release(begin)
                clock.release(end)
            row.input_wait_gpu_ns = total
        clock.release(start)
        clock.release(self.end_mark)
        return row


class StepState:
    """The open step's readings (a plain class: the dataclass's default factories cost a call each).
    The recorder keeps one and refills it with :meth:`begin` at each step (a new one per step cost an
    allocation and a garbage-collector count); a finished step's row holds its lists, not the state."""

    __slots__ = ("collective_marks", "collectives", "fetch_ns", "given_samples", "optimizer_steps",
                 "phase_marks", "phases", "samples", "skipped_updates", "start_mark", "start_ns", "tokens")

    def __init__(self) -> None:
        self.begin(0, None, None, None)

    def begin(self, start_ns: int, start_mark: Any, given_samples: int | None, tokens: int | None) -> None:
        """Every slot set for a new step (the one place that lists them)."""
        self.start_ns = start_ns
        self.start_mark = start_mark
        self.phases: list[list[Any]] = []
        """Phase calls in :class:`PhaseRow`'s layout, as plain lists (cheaper on the training thread)."""
        self.phase_marks: list[tuple[Any, Any]] = []
        """Device marks of each phase call (on a device clock only)."""
        self.optimizer_steps = 0
        self.samples: int | None = None
        self.tokens = tokens
        self.given_samples = given_samples
        self.collectives: list[CollectiveRow] = []
        self.collective_marks: list[list[Any]] = []
        self.fetch_ns = 0
        self.skipped_updates = 0
        """``GradScaler.step`` calls that skipped their update (``capture/scaler_hooks.py``)."""
        """CPU time in batch fetches inside the step (accumulation, a block that holds its fetches)."""
