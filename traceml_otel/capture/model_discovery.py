"""Model discovery: the other models a step runs, besides the one given to ``trace_step``.

A GAN traced with ``trace_step(G)`` runs the discriminator three times per step; a distillation step
runs its teacher; an EMA copy runs beside the model. Their forwards are model compute, not residual.
For the first :data:`DISCOVERY_STEPS` explicit steps, global module hooks see every module call:
an outermost call inside a step, of a module with parameters, outside the autograd engine
(:func:`is_model_call`) and not already timed, is timed as forward there and remembered. After those
steps the global hooks go, and each module found is timed by its class's call like the traced model
(``capture/forward_hooks.py``): no module hook stays on the fast path.

The rule is the one step inference (``capture/inferred_steps.py``) uses to find its roots in
zero-code mode: the outermost call of a module with parameters, and never a forward that the autograd
engine re-runs during backward (gradient checkpointing's recomputation, reentrant or not: it belongs
to backward, and :func:`in_backward` reads the engine's own state, not the order of calls). A module
called inside another's forward is nested, not outermost, and is never counted twice: the depth
counter of the forward timing is shared by every timed model.

``torch.compile``: code Dynamo compiled guards on the global module hooks there were, so adding or
removing them around it recompiles it. Discovery never starts in a process where Dynamo has compiled
anything, nor when the model given to ``trace_step`` is such a wrapper (its first call compiles, and
torch warns there that global hooks "fire an extra time", pointing at our forward timing), and stops
for good, before the compile, when a ``torch.compile(module)`` wrapper is called during it (as step
inference's warm-up does). The models of such a process are timed when
they are given to ``trace_step``.
"""

from __future__ import annotations

import sys
from threading import get_ident
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from traceml_otel.capture.forward_hooks import in_backward, model_class

if TYPE_CHECKING:
    from traceml_otel.capture.forward_hooks import ForwardHooks
    from traceml_otel.capture.recorder import StepRecorder

DISCOVERY_STEPS = 3
"""Explicit steps watched with global module hooks before the models found are timed by their call."""


def is_model_call(module: torch.nn.Module) -> bool:
    """An outermost call that is model compute: a module with parameters, not re-run by the autograd
    engine (checkpointing's recomputation is backward)."""
    return next(module.parameters(), None) is not None and not in_backward()


class ModelDiscovery:
    """Finds and times the other models of explicit steps (see the module docstring)."""

    def __init__(self, recorder: StepRecorder, forward: ForwardHooks) -> None:
        self._recorder = recorder
        self._forward = forward
        self._depth = 0
        self._open: torch.nn.Module | None = None
        self._found: list[Any] = []
        self._handles: list[Any] = []
        self._until = 0
        self._compiled = False
        self._inside: set[int] = set()
        self._traced_class: str | None = None
        """The class of the model given to ``trace_step`` (its forwards' name once another is found)."""
        """``id`` of the traced model's modules (its own, never another model)."""
        """A ``torch.compile`` wrapper was called while discovering: no global hooks from now on."""
        self.found_classes: list[str] = []
        """Class names of the models found (for tests and the session's one line)."""

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def start(self, traced: Any = None) -> None:
        """Watch the next :data:`DISCOVERY_STEPS` steps' module calls (again, for a new traced model).

        ``traced``: the model given to ``trace_step``; its own sub-modules are never other models (a
        loop that calls ``model.forward(x)`` bypasses its timing, and its layers must not stand in)."""
        from torch.nn.modules import module as module_hooks

        try:
            self._inside = {id(m) for m in traced.modules()} if isinstance(traced, torch.nn.Module) else set()
        except Exception:
            self._inside = set()
        self._traced_class = model_class(traced) if isinstance(traced, torch.nn.Module) else None
        self._until = self._recorder.step + DISCOVERY_STEPS
        if isinstance(traced, torch.nn.Module) and _is_compiled_wrapper(traced):
            self._compiled = True  # it compiles at its first call: torch warns of any global hook there
        if self._handles or self._compiled or _dynamo_in_use():
            return
        self._depth = 0
        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._pre),
            module_hooks.register_module_forward_hook(self._post, always_call=True),
        ]

    def install(self) -> None:
        """Nothing until :meth:`start` (the session's installed hooks are installed and undone alike)."""

    def uninstall(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Remove the global hooks (the models found so far stay timed)."""
        while self._handles:
            self._handles.pop().remove()
        self._open = None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if is_compiling():
            return
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            return
        if _is_compiled_wrapper(module):  # it compiles next: no global hook may change around it
            self._compiled = True
            self.stop()
            self._finish()
            return
        self._depth += 1
        if self._depth != 1 or not recorder.in_step or self._forward.in_forward:
            return
        try:
            if id(module) in self._inside or self._forward.watches(module) or not is_model_call(module):
                return
        except Exception:  # never raised into the user's forward
            return
        self._open = module
        if not self._forward.named:  # a second model: each forward row names its model from now on
            self._forward.name_models(self._traced_class)
        self._forward.before_forward(module, args)
        if not any(found is module for found in self._found):
            self._found.append(module)
            self.found_classes.append(type(module).__name__)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if is_compiling():
            return
        owner = self._recorder.owner
        if owner is not None and get_ident() != owner:
            return
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        if self._open is module:
            self._open = None
            self._forward.after_forward(module, args, output)
        if self._recorder.step >= self._until:  # no call of ours is open: the hooks can go now
            self._finish()

    def _finish(self) -> None:
        self.stop()
        for module in self._found:
            try:
                self._forward.watch(module)
            except Exception:
                continue
        self._found = []


def _dynamo_in_use() -> bool:
    """Dynamo has compiled a frame in this process (``torch.compile``, ``module.compile()``): read from
    ``sys.modules`` (importing Dynamo takes seconds; torch's optimizers import it without compiling)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return bool(getattr(convert_frame, "FRAME_COUNTER", 0))


def _is_compiled_wrapper(module: torch.nn.Module) -> bool:
    """``module`` is ``torch.compile(module)``'s wrapper (Dynamo's ``OptimizedModule``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(module, wrapper)
