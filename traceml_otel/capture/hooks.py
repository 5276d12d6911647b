"""Automatic capture: the patches and hooks that feed the :class:`StepRecorder`.

Each hook is a small class with ``install()`` / ``uninstall()``. All of them run on the
training thread, time the wrapped call with the recorder and nothing more, and let
every user exception propagate untouched. Depth guards make nested calls (a module
calling itself, ``Tensor.backward`` calling ``torch.autograd.backward``, an optimizer
wrapping another) count once.

They run once or twice per step each, so they check the thread inline (``recorder.owner`` against
``get_ident()``: a call on another thread is left untimed, and counted when it ends inside a step)
and end phases with :meth:`StepRecorder.phase_done`, which does not check it again; every Python
call saved here is saved on every step (``benchmarks/training_thread_profile.py`` counts them).
The forward hooks, the only ones on the user's own objects, are in ``forward_hooks.py`` (importable
from here as ``hooks.ForwardHooks``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from threading import get_ident
from time import perf_counter_ns
from typing import Any

import torch

from traceml_otel.capture.forward_hooks import ForwardHooks as ForwardHooks
from traceml_otel.capture.recorder import StepRecorder

H2DPredicate = Callable[[torch.Tensor, Any], bool]


def is_host_to_cuda(source: torch.Tensor, result: Any) -> bool:
    """True when ``result`` is a CUDA copy of a CPU tensor."""
    return isinstance(result, torch.Tensor) and result.is_cuda and not source.is_cuda


def parallelism_of(model: torch.nn.Module) -> str:
    """``ddp``, ``fsdp`` or ``none`` for the object itself (the run's value: ``capture.parallelism``)."""
    from traceml_otel.capture.parallelism import wrapper_kind

    return wrapper_kind(model) or "none"


class BackwardPatch:
    """Times ``torch.autograd.backward`` (outermost call), which ``Tensor.backward`` calls.

    Only that one function is wrapped, so a user's traceback through ``loss.backward()`` shows one
    traceml frame (``traceml_timed_backward``), not one per wrapped layer."""

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._depth = 0
        self._original: Any = None

    def timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` timed as the outermost backward."""
        patch, recorder = self, self._recorder

        @functools.wraps(original)
        def traceml_timed_backward(*args: Any, **kwargs: Any) -> Any:
            owner = recorder.owner
            if owner is not None and get_ident() != owner:  # another thread: untimed, counted
                if recorder.in_step:
                    recorder.other_thread_phases += 1
                return original(*args, **kwargs)
            if patch._depth:  # nested (Tensor.backward inside Accelerator.backward): counted once
                patch._depth += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    patch._depth -= 1
            patch._depth = 1
            token = perf_counter_ns(), (  # phase_begin(), inline
                recorder.clock.mark() if recorder.in_step and recorder.device else None)
            try:
                return original(*args, **kwargs)
            finally:
                patch._depth = 0
                recorder.phase_done("backward", token)

        traceml_timed_backward.__traceml_original__ = original  # type: ignore[attr-defined]
        return traceml_timed_backward

    def wrap_method(self, owner: type, name: str) -> Callable[[], None]:
        """Time ``owner.name`` as the outermost backward (e.g. ``Accelerator.backward``); returns an undo."""
        original = owner.__dict__[name]
        setattr(owner, name, self.timed(original))
        return lambda: setattr(owner, name, original)

    def install(self) -> None:
        if self._original is not None:
            return
        self._original = torch.autograd.backward
        torch.autograd.backward = self.timed(self._original)

    def uninstall(self) -> None:
        if self._original is not None:
            torch.autograd.backward = self._original
            self._original = None


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
    (an LR scheduler wraps ``optimizer.step`` there), which escapes the class's new wrapper: only
    then are torch's global step hooks registered, as the fallback that times it. When no optimizer
    existed yet (``init()`` at the top of a script, ``traceml run``), torch's step wrapper runs with
    no hook of ours: two Python calls and a hook loop fewer per step.

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
        self._made_by_torch: set[Any] = set()
        """Wrappers made through ``Optimizer.profile_hook_step`` (classes first used after install)."""
        self._original_profile_hook_step: Any = None
        self.after_update: Callable[[Any, Any], None] | None = None
        """Called with (optimizer, args) after each outermost optimizer call (step inference)."""

    def _timed_step(
        self, step: Callable[..., Any], untimed_if: Callable[[Any], bool] | None = None, gate: Any = None
    ) -> Callable[..., Any]:
        """``step`` timed as the outermost optimizer call. It passes through while ``gate._off`` (by
        default these hooks: uninstalled, while an instance may still hold the wrapper) or when
        ``untimed_if(optimizer)``."""
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
                    hooks._leave(None, args)
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
                hooks._leave_owned(None, args)  # (the thread was checked above)

        traceml_timed_optimizer_step.hooked = True  # type: ignore[attr-defined] - torch's "already wrapped"
        traceml_timed_optimizer_step.__traceml_original__ = step  # type: ignore[attr-defined]
        return traceml_timed_optimizer_step

    def _wrap_optimizer_classes(self) -> None:
        from torch.optim import Optimizer

        original = Optimizer.__dict__["profile_hook_step"]
        self._original_profile_hook_step = original
        Optimizer.profile_hook_step = staticmethod(self._timed_by_torch)  # type: ignore[method-assign]
        for cls in _optimizer_classes():
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
        cls.step = self._timed_step(original, untimed_if, _UNDONE_BY_CALLER)  # type: ignore[attr-defined]
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
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            if recorder.in_step:
                recorder.other_thread_phases += 1
            return
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
        if self._wrapped_classes:  # optimizers were made before: one may hold the old step itself
            self._handles = [
                register_optimizer_step_pre_hook(self.pre),
                register_optimizer_step_post_hook(self.post),
            ]

    @property
    def global_hooks(self) -> bool:
        """Whether torch's global step hooks are registered (the fallback for a step held on an instance)."""
        return bool(self._handles)

    def uninstall(self) -> None:
        from torch.optim import Optimizer

        self._off = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for cls, step in self._wrapped_classes:
            cls.step = step
        self._wrapped_classes = []
        if self._made_by_torch:  # classes first used while installed: torch's own wrapper again
            for cls in _optimizer_classes():
                step = cls.__dict__.get("step")
                if step in self._made_by_torch:
                    cls.step = step.__traceml_original__
            self._made_by_torch = set()
        if self._original_profile_hook_step is not None:
            Optimizer.profile_hook_step = self._original_profile_hook_step  # type: ignore[method-assign]
            self._original_profile_hook_step = None


def _optimizer_classes() -> list[type]:
    """Every subclass of torch's ``Optimizer``, at any depth."""
    from torch.optim import Optimizer

    found: list[type] = []
    pending = list(Optimizer.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


class HostToDevicePatch:
    """Times CPU→CUDA copies made with ``Tensor.to`` or ``Tensor.cuda`` inside a step.

    The copy is timed around the call and kept only when ``is_h2d(source, result)``;
    outside a step, or for a source already on a device, the patch costs two attribute checks.
    """

    def __init__(self, recorder: StepRecorder, is_h2d: H2DPredicate = is_host_to_cuda) -> None:
        self._recorder = recorder
        self._is_h2d = is_h2d
        self._originals: tuple[Any, Any] | None = None

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self._recorder
        is_h2d = self._is_h2d

        @functools.wraps(original)
        def traceml_timed_copy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not recorder.in_step or not tensor.is_cpu:  # only a CPU source can be a host-to-device copy
                return original(tensor, *args, **kwargs)
            token = recorder.phase_begin()
            result = original(tensor, *args, **kwargs)
            if result is not tensor and is_h2d(tensor, result):
                recorder.phase_end("h2d", token, tensor.numel() * tensor.element_size())
            else:
                recorder.clock.release(token[1])
            return result

        traceml_timed_copy.__traceml_original__ = original  # type: ignore[attr-defined]
        return traceml_timed_copy

    def install(self) -> None:
        if self._originals is None:
            self._originals = (torch.Tensor.to, torch.Tensor.cuda)
            torch.Tensor.to = self._timed(self._originals[0])  # type: ignore[method-assign]
            torch.Tensor.cuda = self._timed(self._originals[1])  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._originals is not None:
            torch.Tensor.to, torch.Tensor.cuda = self._originals  # type: ignore[method-assign]
            self._originals = None


_SEQUENCES = (tuple, list)
_TENSOR = torch.Tensor


def batch_samples(batch: Any) -> int | None:
    """The batch dimension of what a loader returned: the leading size of its first tensor.

    Looks into a tuple/list (first item) or a mapping (first value), two levels deep at most;
    ``None`` when no tensor with a dimension is found. A few type checks: cheap on the hot path.
    """
    for _ in range(3):
        if isinstance(batch, torch.Tensor):
            shape = batch.shape
            return int(shape[0]) if shape else None
        if isinstance(batch, (tuple, list)):
            if not batch:
                return None
            batch = batch[0]
        elif isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        else:
            return None
    return None


def loader_settings(iterator: Any) -> tuple[Any, ...]:
    """``(num_workers, pin_memory, persistent_workers, prefetch_factor, batch_size, dataset)`` of the
    loader behind a DataLoader iterator (read from the iterator, which copies them from its loader);
    ``dataset`` is the dataset's class name (``TensorDataset``: already in memory)."""
    batch_size = None
    if getattr(iterator, "_auto_collation", False):
        batch_size = getattr(getattr(iterator, "_index_sampler", None), "batch_size", None)
    workers = int(getattr(iterator, "_num_workers", 0) or 0)
    prefetch = getattr(iterator, "_prefetch_factor", None) if workers else None
    return (
        workers,
        bool(getattr(iterator, "_pin_memory", False)),
        bool(getattr(iterator, "_persistent_workers", False)),
        prefetch if isinstance(prefetch, int) else None,
        batch_size if isinstance(batch_size, int) else None,
        type(getattr(iterator, "_dataset", None)).__name__[:64] if hasattr(iterator, "_dataset") else None,
    )


class DataLoaderPatch:
    """Times every ``next()`` on a DataLoader iterator (single- and multi-process).

    It also reads the batch dimension of each batch (work per step) and, once per new iterator,
    the loader's settings (a weak reference tells a new iterator from the current one).
    """

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._original: Any = None

    def install(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        if self._original is not None:
            return
        self._original = _BaseDataLoaderIter.__next__
        recorder = self._recorder
        original = self._original
        current: list[Any] = [None]  # weak reference to the iterator whose settings were read

        @functools.wraps(original)
        def traceml_timed_next(iterator: Any) -> Any:
            token = perf_counter_ns(), (recorder.clock.mark() if recorder.device else None)  # fetch_begin()
            batch = None
            try:
                batch = original(iterator)
                return batch
            finally:
                if batch is None:
                    samples = None
                elif type(batch) in _SEQUENCES and batch and type(batch[0]) is _TENSOR:  # (x, y): inline
                    shape = batch[0].shape
                    samples = shape[0] if shape else None
                else:
                    samples = batch_samples(batch)
                recorder.fetch_end(token, samples, batch is not None)
                seen = current[0]
                if seen is None or seen() is not iterator:
                    current[0] = weakref.ref(iterator)
                    recorder.loader_seen(loader_settings(iterator))

        _BaseDataLoaderIter.__next__ = traceml_timed_next  # type: ignore[method-assign]

    def uninstall(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        if self._original is not None:
            _BaseDataLoaderIter.__next__ = self._original  # type: ignore[method-assign]
            self._original = None
