"""How this rank's training relates to the other ranks: ``traceml.parallelism``.

The answer must not depend on which object is passed to ``trace_step``: Accelerate's guide
traces ``accelerator.unwrap_model(model)``, which is no DDP wrapper even under DDP. Sources, in
order:

1. an FSDP wrapper (FSDP1 ``FullyShardedDataParallel`` or an FSDP2 ``fully_shard`` module) on the
   model, in its module tree, or recorded as wrapping it;
2. a ``DistributedDataParallel`` around the model, or recorded as wrapping it (constructions after
   ``init()`` are remembered by :class:`WrapperRegistry`);
3. Accelerate's state (``PartialState``): a ``MULTI_*`` type means its prepared model is DDP,
   ``NO`` means the processes do not distribute (a CPU machine without ``ACCELERATE_USE_CPU=1``);
4. the process group: with several processes and none initialized they cannot meet in a collective.

Values: ``ddp`` and ``fsdp`` synchronize gradients; ``independent`` is several processes that do
not; ``none`` is one process, or several sharing a process group with no recognised wrapper (they
may synchronize by hand, so the analyzer keeps treating them as ranks that meet).
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

NONE = "none"
DDP = "ddp"
FSDP = "fsdp"
INDEPENDENT = "independent"

_ACCELERATE_DDP_TYPES = frozenset({
    "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_SDAA",
    "MULTI_HPU", "MULTI_NEURON",
})


def wrapper_kind(module: Any) -> str | None:
    """``ddp`` or ``fsdp`` when ``module`` itself is such a wrapper, else ``None``."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return DDP
    fsdp2 = _fsdp2_module_class()
    if fsdp2 is not None and isinstance(module, fsdp2):
        return FSDP
    name = type(module).__name__
    if "FullyShardedDataParallel" in name:
        return FSDP
    return None


def _fsdp2_module_class() -> type | None:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None) if fsdp is not None else None


def _inner(module: Any) -> Any:
    return getattr(module, "module", None)


class WrapperRegistry:
    """Remembers which modules a DDP or FSDP1 wrapper was built around (after ``install``).

    One dictionary write per wrapper construction; nothing per step.
    """

    def __init__(self) -> None:
        self.wrapped: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        if self._undo:
            return
        self._watch(torch.nn.parallel.DistributedDataParallel, DDP)
        fsdp = sys.modules.get("torch.distributed.fsdp")
        fsdp1 = getattr(fsdp, "FullyShardedDataParallel", None) if fsdp is not None else None
        if fsdp1 is not None:
            self._watch(fsdp1, FSDP)

    def _watch(self, cls: type, kind: str) -> None:
        original = cls.__dict__["__init__"]
        registry = self.wrapped

        @functools.wraps(original)
        def init(wrapper: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            original(wrapper, module, *args, **kwargs)
            try:
                registry[module] = kind
            except TypeError:  # not weak-referenceable: cannot be remembered
                pass

        cls.__init__ = init  # type: ignore[misc]
        self._undo.append(lambda: setattr(cls, "__init__", original))

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []


def _wrapping(model: Any, registry: WrapperRegistry | None) -> str | None:
    """The strongest wrapper found on, around, inside or recorded for ``model``."""
    found: set[str] = set()
    seen = model
    for _ in range(4):  # the model and the wrappers it was unwrapped from (.module chains)
        if seen is None:
            break
        kind = wrapper_kind(seen)
        if kind is not None:
            found.add(kind)
        if registry is not None:
            try:
                recorded = registry.wrapped.get(seen)
            except TypeError:
                recorded = None
            if recorded is not None:
                found.add(recorded)
        seen = _inner(seen)
    if FSDP not in found and isinstance(model, torch.nn.Module):
        if any(wrapper_kind(sub) == FSDP for sub in model.modules()):
            found.add(FSDP)
    if FSDP in found:
        return FSDP
    return DDP if DDP in found else None


def accelerate_distributed_type() -> str | None:
    """The name of Accelerate's ``DistributedType`` once its state exists, else ``None``."""
    state_module = sys.modules.get("accelerate.state")
    if state_module is None:
        return None
    shared = getattr(getattr(state_module, "PartialState", None), "_shared_state", None)
    if not shared:
        return None
    kind = shared.get("distributed_type")
    return None if kind is None else str(getattr(kind, "name", kind)).rsplit(".", 1)[-1]


def process_group_size() -> int | None:
    """The default process group's world size, or ``None`` when none is initialized."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_world_size()


def detect_parallelism(
    model: Any,
    world_size: int,
    registry: WrapperRegistry | None = None,
    *,
    accelerate_type: Callable[[], str | None] = accelerate_distributed_type,
    group_size: Callable[[], int | None] = process_group_size,
) -> str:
    """``ddp``, ``fsdp``, ``independent`` or ``none`` for this rank (see the module docstring)."""
    wrapped = _wrapping(model, registry) if model is not None else None
    if wrapped is not None:
        return wrapped
    processes = max(world_size, group_size() or 1)
    if processes <= 1:
        return NONE
    kind = accelerate_type()
    if kind == "FSDP":
        return FSDP
    if kind in _ACCELERATE_DDP_TYPES:
        return DDP
    if kind == "NO":
        return INDEPENDENT
    if group_size() is None:
        return INDEPENDENT
    return NONE
