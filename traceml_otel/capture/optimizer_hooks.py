"""Times ``optimizer.step()`` as one phase call: an outer wrapper around torch's own step wrapper.

Runs on the training thread like the other hooks (:mod:`traceml_otel.capture.hooks` re-exports
:class:`OptimizerHooks`); see ``docs/architecture.md`` ("The hot path").
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from typing import Any

from traceml_otel.capture.optimizer_registry import OPTIMIZERS, optimizer_classes
from traceml_otel.capture.recorder import StepRecorder


class _UndoneByCaller:
    """The gate of a wrapper that its caller's undo removes (:meth:`OptimizerHooks.wrap_outer_step`)."""

    _off = False


_UNDONE_BY_CALLER = _UndoneByCaller()


class OptimizerHooks:
    """Times ``optimizer.step()`` from the outside, with the global step hooks as a fallback.

    torch wraps each optimizer class's ``step`` once (``Optimizer.profile_hook_step``: a
    profiler range plus the hook loops) and calls the hooks inside that wrapper, so hooks
    alone miss 10-30 us per step, which would show up as residual. The outer wrapper goes
    around torch's wrapper, for classes already wrapped and for those wrapped later.

    An optimizer made before :meth:`install` may hold its class's earlier ``step`` on the instance
    (an LR scheduler wraps ``optimizer.step`` there), which escapes the class's new wrapper. When
    every such optimizer is known (zero-code tracing records each one from the moment ``torch`` is
    imported: :data:`~traceml_otel.capture.optimizer_registry.OPTIMIZERS`), the ``step`` held on each
    instance gets the same outer wrapper. Otherwise (``init()`` called after the optimizer was made,
    or a ``step()`` running at install, whose end only a hook sees) torch's global step hooks are
    registered, as the fallback that times it. With no global hooks,
    torch's step wrapper runs no hook of ours: two Python calls and a hook loop fewer per step.

    Wrappers the user holds instead of the torch optimizer (Accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``) get the same outer timing through :meth:`wrap_outer_step`;
    the inner torch step then nests and counts once. A forward or backward that runs inside the
    call (a closure passed to ``step``, as Lightning does) is its own phase: the optimizer phase
    restarts after it, so no time is counted twice.
    """

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._depth = 0
        self._token: tuple[int, Any] | None = None
        self._outer = 0
        """Open calls of our own step wrappers on the training thread (torch's hooks inside skip)."""
        self._off = True
        """Not installed: a wrapper still held (an LR scheduler's copy of ``step``) passes through."""
        self._handles: list[Any] = []
        """torch's global step hooks (only when an optimizer may predate the class wrappers)."""
        self._wrapped_classes: list[tuple[type, Any]] = []
        self._held_steps: list[tuple[weakref.ref[Any], Any, Any]] = []
        """(optimizer, the ``step`` it held, our wrapper of it): instances given the outer wrapper."""
        self._made_by_torch: set[Any] = set()
        """Wrappers made through ``Optimizer.profile_hook_step`` (classes first used after install)."""
        self._original_profile_hook_step: Any = None
        self.after_update: Callable[[Any, Any], None] | None = None
        """Called with (optimizer, args) after each outermost optimizer call (step inference).
        ``optimizer`` is ``None`` (then it is ``args[0]``), the optimizer, or a weak reference to it."""

    def _timed_step(
        self, step: Callable[..., Any], untimed_if: Callable[[Any], bool] | None = None, gate: Any = None,
        optimizer: Any = None,
    ) -> Callable[..., Any]:
        """``step`` timed as the outermost optimizer call. It passes through while ``gate._off`` (by
        default these hooks: uninstalled, while an instance may still hold the wrapper) or when
        ``untimed_if(optimizer)``. ``optimizer``: a weak reference to the instance, for a ``step``
        held on it (called without it; weak, as torch's scheduler holds it, so that the instance's own
        attribute does not keep it alive); ``None`` for a class's (its first argument)."""
        hooks, recorder = self, self._recorder
        gate = self if gate is None else gate

        @functools.wraps(step)
        def traceml_timed_optimizer_step(*args: Any, **kwargs: Any) -> Any:
            if gate._off or (untimed_if is not None and args and untimed_if(args[0])):
                return step(*args, **kwargs)
            owner = recorder.owner
            if owner is not None and get_ident() != owner:  # another thread: untimed, counted when it ends
                try:
                    return step(*args, **kwargs)
                finally:
                    hooks._leave(optimizer, args)
            depth = hooks._depth = hooks._depth + 1  # _enter(), inline: one call fewer every step
            if depth == 1:
                hooks._token = perf_counter_ns(), (
                    recorder.clock.mark() if recorder.in_step and recorder.device else None)
                recorder.on_nested_phase = hooks._restart
            hooks._outer += 1  # torch's own step hooks inside are then no-ops
            try:
                return step(*args, **kwargs)
            finally:
                hooks._outer -= 1
                depth = hooks._depth - 1  # _leave_owned(optimizer, args), inline (the thread was checked)
                if depth > 0:
                    hooks._depth = depth
                else:
                    hooks._depth = 0
                    recorder.on_nested_phase = None
                    token = hooks._token
                    if token is not None:
                        hooks._token = None
                        recorder.phase_done("optimizer", token, None, True)  # and counts the update
                    elif depth < 0:
                        recorder.optimizer_stepped()
                    if hooks.after_update is not None:
                        hooks.after_update(optimizer, args)

        traceml_timed_optimizer_step.hooked = True  # torch's "already wrapped"
        traceml_timed_optimizer_step.__traceml_original__ = step
        return traceml_timed_optimizer_step

    def _wrap_optimizer_classes(self) -> None:
        from torch.optim import Optimizer

        original = Optimizer.__dict__["profile_hook_step"]
        self._original_profile_hook_step = original
        Optimizer.profile_hook_step = staticmethod(self._timed_by_torch)
        for cls in optimizer_classes():
            step = cls.__dict__.get("step")
            if getattr(step, "hooked", False) and not hasattr(step, "__traceml_original__"):
                self._wrapped_classes.append((cls, step))
                cls.step = self._timed_step(step)

    def _timed_by_torch(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``Optimizer.profile_hook_step`` while installed: torch's wrapper, inside ours (a class whose
        first instance is made now)."""
        torch_wrapper = self._original_profile_hook_step.__func__(func)
        torch_wrapper.hooked = True  # what torch marks on the class's step: it is the step once uninstalled
        wrapped = self._timed_step(torch_wrapper)
        self._made_by_torch.add(wrapped)
        return wrapped

    def wrap_outer_step(
        self, cls: type, untimed_if: Callable[[Any], bool] | None = None
    ) -> Callable[[], None]:
        """Time ``cls.step`` as the outermost optimizer call; returns an undo.

        ``untimed_if(optimizer)`` true means the call is a documented no-op (a gradient-accumulation
        micro-step of an Accelerate wrapper): it is not timed and is no optimizer update.
        """
        original = cls.__dict__["step"]
        cls.step = self._timed_step(original, untimed_if, _UNDONE_BY_CALLER)
        return lambda: setattr(cls, "step", original)

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step hook (global or per optimizer): the call starts."""
        if self._outer and get_ident() == self._recorder.owner:  # inside our wrapper: timed there
            return
        self._enter()

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step hook (global or per optimizer): the call ends."""
        if self._outer and get_ident() == self._recorder.owner:
            return
        self._leave(optimizer, args)

    def _enter(self) -> bool:
        """An optimizer call starts; False on a thread other than the training thread (left untimed)."""
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            return False
        depth = self._depth = self._depth + 1
        if depth == 1:
            self._token = recorder.phase_begin()
            recorder.on_nested_phase = self._restart
        return True

    def _restart(self) -> None:
        """A phase ran inside this optimizer call: the optimizer phase starts again after it."""
        if self._token is not None:
            self._recorder.clock.release(self._token[1])
            self._token = self._recorder.phase_begin()

    def _leave(self, optimizer: Any, args: Any) -> None:
        """An optimizer call ends: the outermost one is a phase call and an update."""
        if not self._recorder.other_thread():
            self._leave_owned(optimizer, args)

    def _leave_owned(self, optimizer: Any, args: Any) -> None:
        """:meth:`_leave` on the training thread (or before it is known)."""
        recorder = self._recorder
        depth = self._depth - 1
        if depth > 0:
            self._depth = depth
            return
        self._depth = 0
        recorder.on_nested_phase = None
        token = self._token
        if token is not None:
            self._token = None
            recorder.phase_done("optimizer", token, None, True)  # and counts the update
        elif depth < 0:  # a call that began before these hooks were installed (zero-code tracing
            recorder.optimizer_stepped()  # starts at the forward inside a closure): an update, untimed
        if self.after_update is not None:
            self.after_update(optimizer, args)

    def install(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        if not self._off:
            return
        self._off = False
        self._wrap_optimizer_classes()
        if not self._wrapped_classes:  # no optimizer was made before: none holds an old step
            return
        # Each one known: the step any of them holds gets our wrapper. A step() running now (zero-code
        # tracing starts at a closure's forward) ends through no wrapper of ours: the hooks see its end.
        if OPTIMIZERS.complete and not self._step_running():
            for optimizer in OPTIMIZERS.alive():
                self._wrap_held_step(optimizer)
        else:
            self._handles = [
                register_optimizer_step_pre_hook(self.pre),
                register_optimizer_step_post_hook(self.post),
            ]

    def _step_running(self) -> bool:
        """Whether torch's step wrapper is on this thread's stack (an optimizer's ``step()`` is running)."""
        torch_wrapper = self._original_profile_hook_step.__func__(_stand_in_step).__code__
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code is torch_wrapper:
                return True
            frame = frame.f_back
        return False

    def _wrap_held_step(self, optimizer: Any) -> None:
        """Time the ``step`` that ``optimizer`` holds on itself (an LR scheduler's), if any."""
        held = vars(optimizer).get("step")
        if held is None or hasattr(held, "__traceml_original__"):
            return
        ref = weakref.ref(optimizer)
        wrapper = self._timed_step(held, optimizer=ref)
        optimizer.step = wrapper
        self._held_steps.append((ref, held, wrapper))

    @property
    def global_hooks(self) -> bool:
        """Whether torch's global step hooks are registered (the fallback for a step held on an instance)."""
        return bool(self._handles)

    @property
    def held_steps(self) -> int:
        """Optimizers whose own ``step`` attribute (an LR scheduler's) got the outer wrapper."""
        return len(self._held_steps)

    def uninstall(self) -> None:
        from torch.optim import Optimizer

        self._off = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for cls, step in self._wrapped_classes:
            cls.step = step
        self._wrapped_classes = []
        for ref, held, wrapper in self._held_steps:
            optimizer = ref()
            if optimizer is not None and vars(optimizer).get("step") is wrapper:
                optimizer.step = held
        self._held_steps = []
        if self._made_by_torch:  # classes first used while installed: torch's own wrapper again
            for cls in optimizer_classes():
                step = cls.__dict__.get("step")
                if step in self._made_by_torch:
                    cls.step = step.__traceml_original__
            self._made_by_torch = set()
        if self._original_profile_hook_step is not None:
            Optimizer.profile_hook_step = self._original_profile_hook_step
            self._original_profile_hook_step = None


def _stand_in_step() -> None:
    """A stand-in step: torch's wrapper of it shares its code with every class's wrapper."""
