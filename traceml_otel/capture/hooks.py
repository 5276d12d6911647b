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
The forward hooks, the only ones on the user's own objects, are in ``forward_hooks.py``, the
optimizer's in ``optimizer_hooks.py`` (importable from here as ``hooks.ForwardHooks`` and
``hooks.OptimizerHooks``).
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
from traceml_otel.capture.optimizer_hooks import OptimizerHooks as OptimizerHooks
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
            torch.Tensor.to = self._timed(self._originals[0])
            torch.Tensor.cuda = self._timed(self._originals[1])

    def uninstall(self) -> None:
        if self._originals is not None:
            torch.Tensor.to, torch.Tensor.cuda = self._originals
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
        source: list[Any] = [None]  # its dataset's id: which loader fetched (capture/training_loader.py)

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
                seen = current[0]
                if seen is None or seen() is not iterator:
                    current[0] = weakref.ref(iterator)
                    source[0] = id(getattr(iterator, "_dataset", iterator))
                    recorder.fetch_end(token, samples, batch is not None, source[0])
                    recorder.loader_seen(loader_settings(iterator), source[0])
                else:
                    recorder.fetch_end(token, samples, batch is not None, source[0])

        _BaseDataLoaderIter.__next__ = traceml_timed_next

    def uninstall(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        if self._original is not None:
            _BaseDataLoaderIter.__next__ = self._original
            self._original = None
