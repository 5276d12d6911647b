"""What the framework callbacks share: start telemetry, open and close steps, time framework calls.

A callback cannot wrap the step in a ``with`` block, so it enters and exits ``trace_step`` at the
framework's step boundaries. Phase timing reuses the hooks of ``init()`` (same depth counters), so a
framework method timed here and the torch call inside it count once. Everything goes through the
public API and the process's training session (:mod:`traceml_otel.capture.session`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from traceml_otel import _api as traceml
from traceml_otel import session_root
from traceml_otel.capture.session import current


class StepDriver:
    """Opens and closes ``trace_step`` blocks from framework callbacks."""

    def __init__(self, init_kwargs: dict[str, Any] | None = None, source: str = "trace_step") -> None:
        self._init_kwargs = init_kwargs or {}
        self.source = source
        """``traceml.step.source`` of the steps this driver opens (``hf_trainer``, ``lightning``)."""
        self._open: contextlib.AbstractContextManager[None] | None = None
        self._batches = 0
        """Batches in the open step (gradient accumulation: several per update)."""
        self._outside: list[contextlib.AbstractContextManager[None]] = []
        self.undo: list[Callable[[], None]] = []

    def start(self) -> None:
        """``traceml.init(**init_kwargs)`` unless the program already called it."""
        if not session_root.init_called():
            traceml.init(**self._init_kwargs)

    @property
    def in_step(self) -> bool:
        return self._open is not None

    def begin(self, model: Any, samples: int | None = None) -> None:
        """Open a step (closing one left open first); ``samples`` is the step's declared work."""
        if self._open is not None:
            self.end("IncompleteStep")
        context = traceml.trace_step(model, samples=samples)
        context.__enter__()
        self._open = context
        self._batches = 0
        recorder = current().recorder
        if recorder is not None:
            recorder.source = self.source

    def end(self, exception_type: str | None = None) -> None:
        """Close the open step, if any."""
        context, self._open = self._open, None
        if context is None:
            return
        if exception_type is None:
            context.__exit__(None, None, None)
        else:
            current().end_step(exception_type)

    def end_after_update(self, batches_per_update: int) -> None:
        """A batch ended: close the open step once it holds an optimizer update (gradient accumulation
        keeps one step open over the update's micro-batches), or after ``batches_per_update`` batches
        without one (a skipped update)."""
        self._batches += 1
        recorder = current().recorder
        if (recorder is None or not recorder.in_step or recorder.updates_in_step
                or self._batches >= batches_per_update):
            self.end()

    def forget_input_wait(self) -> None:
        """Evaluation fetched batches between two training steps: not the next step's input wait."""
        recorder = current().recorder
        if recorder is not None and self._open is None:
            recorder.forward_between_steps(False)

    def resumed_at(self, updates: Any) -> None:
        """The framework resumed from a checkpoint after ``updates`` optimizer updates (its global step).

        After a restart, the updates the earlier attempt made beyond it are redone
        (``traceml.resume_from``)."""
        if isinstance(updates, int) and not isinstance(updates, bool) and updates > 0:
            traceml.resume_from(updates)

    def begin_outside(self, kind: str) -> None:
        """Evaluation or a checkpoint starts between steps (``traceml.outside_step(kind)``, opened)."""
        context = traceml.outside_step(kind)
        context.__enter__()
        self._outside.append(context)

    def end_outside(self) -> None:
        """The innermost block opened by :meth:`begin_outside` ends."""
        if self._outside:
            self._outside.pop().__exit__(None, None, None)

    def time_outside(self, owner: Any, name: str, kind: str) -> None:
        """Run each ``owner.name(...)`` call (a method, or a class's function) in ``outside_step(kind)``."""
        original = getattr(owner, name, None)
        if original is None or getattr(original, "__traceml_outside__", False):
            return
        outside = traceml.outside_step(kind)

        @functools.wraps(original)
        def between_steps(*args: Any, **kwargs: Any) -> Any:
            with outside:
                return original(*args, **kwargs)

        between_steps.__traceml_outside__ = True  # type: ignore[attr-defined]
        self._patch(owner, name, between_steps)

    def time_forward(self, owner: Any, name: str) -> None:
        """Time ``owner.name(...)`` (an instance attribute) as the outermost forward."""
        session = current()
        if session.recorder is not None:
            self._patch(owner, name, session.timed_forward(getattr(owner, name)))

    def time_backward(self, owner: Any, name: str) -> None:
        """Time ``owner.name(...)`` (an instance attribute) as the outermost backward."""
        session = current()
        if session.recorder is not None:
            self._patch(owner, name, session.timed_backward(getattr(owner, name)))

    def time_optimizer_class(self, cls: type) -> None:
        """Time ``cls.step`` as the outermost optimizer call (e.g. Lightning's ``LightningOptimizer``)."""
        undo = current().time_optimizer_class(cls)
        if undo is not None:
            self.undo.append(undo)

    def _patch(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        had_own = name in getattr(owner, "__dict__", {})
        previous = owner.__dict__.get(name) if had_own else None
        setattr(owner, name, replacement)

        def restore() -> None:
            if had_own:
                setattr(owner, name, previous)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass

        self.undo.append(restore)

    def restore(self) -> None:
        """Undo every patch made here and end open ``outside_step`` blocks (at the end of training)."""
        while self._outside:
            self.end_outside()
        while self.undo:
            self.undo.pop()()
