"""Forward timing: the outermost forward of each traced model, from hooks on that model alone.

The two hooks torch keeps on the model are :class:`CopySafeHook` objects: a ``copy.deepcopy`` or a
pickle of the model carries no-op hooks, never the capture state (``capture/copy_safe.py``). They
run on the training thread every step, so each one's logic is inline in its ``__call__``.

Each hook returns at once while Dynamo traces it (``torch.compiler.is_compiling()``, which Dynamo
folds to ``True`` without a guard): a hooked module inside a ``torch.compile``d region (the user
compiled a wrapper, or called ``model.compile()``) compiles as if unhooked, with no graph break and
no crash under ``fullgraph=True``; that forward is then not timed by these hooks.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from typing import Any

import torch
from torch.compiler import is_compiling

from traceml_otel.capture.copy_safe import CopySafeHook
from traceml_otel.capture.recorder import StepRecorder


class ForwardHooks:
    """Times the outermost forward of each traced model via module hooks.

    Hooks go on the model passed to ``trace_step`` only (not every module), so sub-modules
    cost nothing; a depth counter shared by all traced models ignores nested calls, e.g. a
    DDP wrapper and its ``.module`` both traced. The hooks are :class:`CopySafeHook` objects: a
    ``copy.deepcopy`` or pickle of a traced model carries no-op hooks, not this object.
    """

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._depth = 0
        self._token: tuple[int, Any] | None = None
        self._handles: weakref.WeakKeyDictionary[torch.nn.Module, list[Any]] = weakref.WeakKeyDictionary()
        self.before_forward = _ForwardStart(self)
        """A module call starts (the forward pre-hook; also called directly by step inference)."""
        self.after_forward = _ForwardEnd(self)
        """A module call ends (the forward hook, also run when the call raised)."""

    def watch(self, model: torch.nn.Module,
              on_refused: Callable[[torch.nn.Module], None] | None = None) -> None:
        """Hook ``model`` once; later calls are a dictionary lookup.

        Torch refuses hooks on a scripted TorchScript module (``torch.jit.script``;
        ``torch.jit.trace``'s modules take hooks): ``register_forward_pre_hook`` raises. Nothing is
        hooked then, ``on_refused(model)`` is called that once, and the refusal is kept: the model is
        not asked again, however often the traced model changes.
        """
        if model in self._handles:
            return
        handles: list[Any] = []
        try:
            handles.append(model.register_forward_pre_hook(self.before_forward))
            handles.append(model.register_forward_hook(self.after_forward, always_call=True))
        except Exception:  # never a reason to stop the step or the training
            for handle in handles:
                handle.remove()
            self._handles[model] = []
            if on_refused is not None:
                on_refused(model)
            return
        self._handles[model] = handles

    @property
    def in_forward(self) -> bool:
        """An outermost forward is open (its pre-hook ran, its hook has not yet)."""
        return self._depth > 0

    def timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` timed as an outermost forward (a framework's training-step method)."""
        hooks = self

        @functools.wraps(call)
        def traceml_timed_forward(*args: Any, **kwargs: Any) -> Any:
            hooks.before_forward(None, args)
            try:
                return call(*args, **kwargs)
            finally:
                hooks.after_forward(None, args, None)

        return traceml_timed_forward

    def install(self) -> None:
        """Nothing global: models are hooked as they are traced."""

    def uninstall(self) -> None:
        for handles in list(self._handles.values()):
            for handle in handles:
                handle.remove()
        self._handles = weakref.WeakKeyDictionary()


class _ForwardStart(CopySafeHook):
    """``ForwardHooks.before_forward``: the outermost module call opens a forward phase."""

    __slots__ = ("_hooks", "_recorder")

    def __init__(self, hooks: ForwardHooks) -> None:
        self._hooks = hooks
        self._recorder = hooks._recorder

    def __call__(self, module: torch.nn.Module | None, args: Any) -> None:
        if is_compiling():  # traced by Dynamo: compile nothing of ours (see the module docstring)
            return
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            return
        hooks = self._hooks
        depth = hooks._depth = hooks._depth + 1
        if depth == 1:
            hooks._token = perf_counter_ns(), (  # phase_begin(), inline
                recorder.clock.mark() if recorder.in_step and recorder.device else None)


class _ForwardEnd(CopySafeHook):
    """``ForwardHooks.after_forward``: the outermost module call's end closes the forward phase."""

    __slots__ = ("_hooks", "_recorder")

    def __init__(self, hooks: ForwardHooks) -> None:
        self._hooks = hooks
        self._recorder = hooks._recorder

    def __call__(self, module: torch.nn.Module | None, args: Any, output: Any) -> None:
        if is_compiling():
            return
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            if recorder.in_step:
                recorder.other_thread_phases += 1
            return
        hooks = self._hooks
        depth = hooks._depth - 1
        if depth > 0:
            hooks._depth = depth
            return
        hooks._depth = 0
        token = hooks._token
        if token is not None:
            hooks._token = None
            recorder.phase_done("forward", token)
