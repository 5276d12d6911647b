"""Zero-code tracing's start: at the loop's first batch fetch or module call, telemetry and step
inference (:mod:`traceml_otel.capture.inferred_steps`) start, at almost no cost before then."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from traceml_otel.capture.compiled_in_place import LISTENER, patch_module_compile
from traceml_otel.capture.optimizer_registry import OPTIMIZERS

if TYPE_CHECKING:
    from traceml_otel.capture.inferred_steps import InferredSteps


class _Arming:
    """Waits, at almost no cost, for the loop's first batch fetch or module call, then starts.

    Installed when torch is imported. Telemetry does not start then: the script may still call
    ``traceml.init()`` with its own arguments (or ``disabled=True``), and a script that never trains
    starts no emitter. At the first ``DataLoader`` ``next()`` or the first module call, after the
    script's own setup, ``start`` runs (``init()`` only if the script has not called
    it), and that first fetch or forward is already part of what it times.
    """

    def __init__(self) -> None:
        self.start: Callable[[], InferredSteps | None] | None = None
        """What starts telemetry and inference (zero-code tracing's ``start_inference``)."""
        self.fired = False
        self._forward_handle: Any = None
        self._original_next: Any = None

    def arm(self) -> None:
        from torch.nn.modules import module as module_hooks
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        OPTIMIZERS.track()  # before the script builds its optimizers
        patch_module_compile()  # and compiles its models in place
        LISTENER.call = self._first_in_place_call
        self._forward_handle = module_hooks.register_module_forward_pre_hook(self._first_forward)
        original = self._original_next = _BaseDataLoaderIter.__next__
        arming = self

        def armed_next(iterator: Any) -> Any:
            if arming.fired:
                return original(iterator)
            outermost = _BaseDataLoaderIter.__next__ is armed_next
            if outermost:  # no hook wraps us yet: step aside so init()'s fetch timing wraps the original
                _BaseDataLoaderIter.__next__ = original
            arming.fire()
            # outermost: the class's __next__ is now init()'s timed one; else a hook around us times it
            return _BaseDataLoaderIter.__next__(iterator) if outermost else original(iterator)

        _BaseDataLoaderIter.__next__ = armed_next

    def _first_forward(self, module: torch.nn.Module, args: Any) -> None:
        if is_compiling():  # traced by Dynamo: start nothing there (the next eager call or fetch does)
            return
        inferred = self.fire()
        if inferred is not None:  # the hooks it installed do not run for this call: run them here
            inferred._global_pre(module, args)

    def _first_in_place_call(self, module: torch.nn.Module, compiled: Callable[..., Any], args: tuple,
                             kwargs: dict) -> Any:
        """The first module call is of a module compiled in place (no hook of ours sees it)."""
        inferred = self.fire()
        if inferred is None:
            return compiled(*args, **kwargs)
        return inferred.in_place_call(module, compiled, args, kwargs)

    def fire(self) -> InferredSteps | None:
        if self.fired:
            return None
        self.fired = True
        if LISTENER.call == self._first_in_place_call:
            LISTENER.call = None
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None
        try:
            return self.start() if self.start is not None else None
        except Exception as error:  # never a reason not to train
            print(f"traceml: step inference is off: {type(error).__name__}: {error}", file=sys.stderr,
                  flush=True)
            return None


_ARMING = _Arming()


def arm_inference(start: Callable[[], InferredSteps | None]) -> None:
    """Call ``start`` (telemetry and step inference) at the loop's first fetch or forward (see
    :class:`_Arming`)."""
    if not _ARMING.fired and _ARMING._original_next is None:
        _ARMING.start = start
        _ARMING.arm()
