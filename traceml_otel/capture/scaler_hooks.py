"""Skipped updates: a ``GradScaler.step`` that found inf/NaN gradients and did not call
``optimizer.step()``.

Such an iteration is a step like any other (its forward and backward ran), with no optimizer update:
it is counted as a *skipped update* (``traceml.optimizer.skipped``), never as a gradient-accumulation
micro-step. ``GradScaler.step`` (``torch.amp``'s, which ``torch.cuda.amp``'s inherits) is wrapped once
per class; the wrapper reads the recorder's step number and update count before and after the call
(no device sync: the scaler made its own). With explicit steps the open step keeps the count; under
step inference (zero-code) the skip ends the step as the update would have (``after_update``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from threading import get_ident
from typing import Any

from traceml_otel.capture.recorder import StepRecorder


class ScalerHooks:
    """Wraps ``torch.amp.GradScaler.step`` to count the updates it skips."""

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._original: Any = None
        self.after_skip: Callable[[Any, Any], None] | None = None
        """Called with (optimizer, args) after a skipped update (step inference ends its step there)."""

    def install(self) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # an older torch: nothing to count
            return
        if self._original is not None:
            return
        original = self._original = GradScaler.__dict__["step"]
        hooks, recorder = self, self._recorder

        @functools.wraps(original)
        def traceml_counted_scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            step, updates = recorder.step, recorder.updates_in_step
            result = original(scaler, optimizer, *args, **kwargs)
            try:
                if (recorder.in_step and recorder.step == step and recorder.updates_in_step == updates
                        and get_ident() == recorder.owner):
                    recorder.state.skipped_updates += 1
                    if hooks.after_skip is not None:
                        hooks.after_skip(optimizer, ())
            except Exception:  # never raised into the user's update
                pass
            return result

        traceml_counted_scaler_step.__traceml_original__ = original  # type: ignore[attr-defined]
        GradScaler.step = traceml_counted_scaler_step

    def uninstall(self) -> None:
        if self._original is None:
            return
        from torch.amp.grad_scaler import GradScaler

        GradScaler.step = self._original
        self._original = None
