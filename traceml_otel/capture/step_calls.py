"""The calls inside an open step: phases (forward, backward, optimizer, h2d) and collectives.

The hot path's second half, on the training thread (collectives may end on another): each call is a
clock reading at each end and a row appended to the open step's :class:`~traceml_otel.capture.
step_state.StepState`. :class:`StepCalls` is a base of :class:`~traceml_otel.capture.recorder.
StepRecorder`, which owns the state it reads; the hooks call these methods on the recorder as before
(a method found on a base class is looked up through the same type cache: no extra call).
"""

from __future__ import annotations

from threading import get_ident
from time import perf_counter_ns
from typing import Any

from traceml_otel.capture.device_clock import CpuClock
from traceml_otel.capture.step_state import StepState
from traceml_otel.wire.step_row import CollectiveRow


class StepCalls:
    """Phase and collective calls of the open step (:class:`~traceml_otel.capture.recorder.
    StepRecorder`'s, which sets every attribute declared here)."""

    clock: CpuClock
    device: bool
    in_step: bool
    owner: int | None
    state: StepState
    other_thread_phases: int
    on_nested_phase: Any

    # --- phases ----------------------------------------------------------------
    def phase_begin(self) -> tuple[int, Any]:
        """Mark the start of a phase call."""
        return perf_counter_ns(), (self.clock.mark() if self.in_step and self.device else None)

    def phase_end(self, phase: str, token: tuple[int, Any], nbytes: int | None = None) -> None:
        """Record one call of ``phase`` that began at ``token``."""
        if self.other_thread():
            self.clock.release(token[1])
            return
        self.phase_done(phase, token, nbytes)

    def other_thread(self) -> bool:
        """Whether this is a thread other than the training thread: a phase call ending here is left
        untimed, and counted when a step is open. (The hooks that run every step check it inline.)"""
        owner = self.owner
        if owner is None or get_ident() == owner:
            return False
        if self.in_step:
            self.other_thread_phases += 1
        return True

    def phase_done(
        self, phase: str, token: tuple[int, Any], nbytes: int | None = None, update: bool = False,
        module: str | None = None,
    ) -> None:
        """:meth:`phase_end` for a hook that has already checked it runs on the training thread.

        ``update``: the call was an optimizer update (:meth:`optimizer_stepped` in the same call);
        ``module``: the model's class, for a forward of a step that ran several models.
        The call is appended in the order it ends, unnumbered (``call`` is ``None``: the emitter
        numbers it from that order, :func:`~traceml_otel.wire.step_row.calls_in_order`).
        overhead_pairs fast 2x5: hooks inlining it +101 us/step, calling it +109; A/A -120..+109: folded.
        """
        end = perf_counter_ns()
        if not self.in_step:
            self.clock.release(token[1])
            return
        state = self.state
        if update:
            state.optimizer_steps += 1
        # A plain list in PhaseRow's layout: a PhaseRow per call costs 0.3 us more (construction and
        # release of a list subclass); OpenStep.resolve views them as PhaseRows to fill device timings.
        if module is None:
            state.phases.append([phase, None, token[0], end, None, None, nbytes])
        else:  # a forward of a step that ran several models: its model's class, an eighth slot
            state.phases.append([phase, None, token[0], end, None, None, nbytes, module])
        if self.device:
            state.phase_marks.append((token[1], self.clock.mark()))
        if self.on_nested_phase is not None and phase != "optimizer":
            self.on_nested_phase()

    def optimizer_stepped(self) -> None:
        """Count an optimizer update inside the current step."""
        if self.in_step and get_ident() == self.owner:
            self.state.optimizer_steps += 1

    @property
    def last_phase(self) -> str | None:
        """The name of the open step's last phase call so far (``None`` when none, or no step is open)."""
        if not self.in_step or not self.state.phases:
            return None
        return self.state.phases[-1][0]

    @property
    def updates_in_step(self) -> int:
        """Optimizer updates counted in the open step so far (0 when none is open)."""
        return self.state.optimizer_steps if self.in_step else 0

    # --- collectives -------------------------------------------------------------
    def collective_begin(
        self, kind: str, source: str, nbytes: int, blocking: bool
    ) -> tuple[CollectiveRow, list[Any]] | None:
        """Mark the start of a collective call; ``None`` outside a step (nothing is recorded).

        May run on a thread other than the training thread (autograd's, for DDP buckets).
        """
        if not self.in_step:
            return None
        state = self.state
        marks = [self.clock.mark(), None]
        row = CollectiveRow.started(
            kind=kind, source=source, start_ns=perf_counter_ns(), nbytes=nbytes, blocking=blocking
        )
        state.collectives.append(row)
        state.collective_marks.append(marks)
        return row, marks

    def collective_end(self, token: tuple[CollectiveRow, list[Any]]) -> None:
        """Mark the completion of a collective (from whichever thread saw it complete)."""
        row, marks = token
        marks[1] = self.clock.mark()
        row.end_ns = perf_counter_ns()
