"""Automatic capture of Accelerate's own calls: the copies its prepared loaders make between steps,
``AcceleratedOptimizer.step`` and ``Accelerator.backward``. Each installs only once ``accelerate`` is
imported (at ``init()``, or later at a first step: the training session catches up).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from traceml_otel.capture.hooks import BackwardPatch, OptimizerHooks
    from traceml_otel.capture.recorder import StepRecorder


def is_accelerator_device(device: Any) -> bool:
    """True for a CUDA (or other non-CPU) target of Accelerate's ``send_to_device``."""
    try:
        return torch.device(device).type not in ("cpu", "meta")
    except (RuntimeError, TypeError):
        return False


class AcceleratePrefetchPatch:
    """Times the copies Accelerate's prepared loaders make between steps (``send_to_device``).

    ``DataLoaderShard`` moves each batch to the device after fetching it and before handing
    it over, outside both the fetch and the step, so TraceML never sees these copies. They
    are recorded as the next step's prefetch h2d. Installs only once ``accelerate`` is imported.
    """

    def __init__(
        self, recorder: StepRecorder, is_device: Callable[[Any], bool] = is_accelerator_device
    ) -> None:
        self._recorder = recorder
        self._is_device = is_device
        self._module: Any = None
        self._original: Any = None

    def install(self) -> None:
        import sys

        module = sys.modules.get("accelerate.data_loader")
        if module is None or self._original is not None or not hasattr(module, "send_to_device"):
            return
        recorder, is_device, original = self._recorder, self._is_device, module.send_to_device

        @functools.wraps(original)
        def timed_send(batch: Any, device: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.in_step or not is_device(device):
                return original(batch, device, *args, **kwargs)
            started = perf_counter_ns()
            try:
                return original(batch, device, *args, **kwargs)
            finally:
                recorder.add_prefetch_h2d(perf_counter_ns() - started)

        self._module, self._original = module, original
        module.send_to_device = timed_send

    @property
    def installed(self) -> bool:
        return self._original is not None

    def uninstall(self) -> None:
        if self._original is not None:
            self._module.send_to_device = self._original
            self._module = self._original = None


def _accelerate_micro_step(optimizer: Any) -> bool:
    """An ``AcceleratedOptimizer.step`` that does nothing: gradients are still accumulating."""
    state = getattr(optimizer, "gradient_state", None)
    return state is not None and not state.sync_gradients


class AccelerateCallsPatch:
    """Times Accelerate's ``AcceleratedOptimizer.step`` and ``Accelerator.backward`` as the user calls them.

    ``optimizer.step()`` on a prepared optimizer runs Accelerate's wrapper (gradient-state checks,
    a GradScaler's step and update) around torch's step, and ``accelerator.backward`` scales the
    loss before ``loss.backward()``. Timed only inside, that work showed up as residual. Both are
    timed from the outside with the same depth counters as the torch hooks, so the inner calls count
    once. A micro-step's ``optimizer.step()`` (a no-op under ``accumulate``) is not timed. Installs
    only once ``accelerate`` is imported.
    """

    def __init__(self, optimizer_hooks: OptimizerHooks | None, backward: BackwardPatch | None) -> None:
        self._optimizer_hooks = optimizer_hooks
        self._backward = backward
        self._undo: list[Callable[[], None]] = []
        self.installed = False

    def install(self) -> None:
        import sys

        optimizer_module = sys.modules.get("accelerate.optimizer")
        accelerator_module = sys.modules.get("accelerate.accelerator")
        if self.installed or optimizer_module is None or accelerator_module is None:
            return
        self.installed = True
        wrapper = getattr(optimizer_module, "AcceleratedOptimizer", None)
        if self._optimizer_hooks is not None and wrapper is not None and "step" in wrapper.__dict__:
            self._undo.append(self._optimizer_hooks.wrap_outer_step(wrapper, _accelerate_micro_step))
        accelerator = getattr(accelerator_module, "Accelerator", None)
        if self._backward is not None and accelerator is not None and "backward" in accelerator.__dict__:
            self._undo.append(self._backward.wrap_method(accelerator, "backward"))

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self.installed = False
