"""The torch optimizers alive in the process, for step inference (``capture/inferred_steps.py``).

``Optimizer.__init__`` is wrapped once, before the script builds its optimizers, so every optimizer
is known: an inferred step ends once each live optimizer has stepped (a GAN's two), and a new
optimizer tells inference to look for a new model's forwards.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch


class OptimizerRegistry:
    """The torch optimizers alive in the process (``Optimizer.__init__`` records each one)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.ids: set[int] = set()
        """Ids of the optimizers alive and waited for (read on every update: kept ready, not rebuilt)."""
        self._tracking = False
        self.built = 0
        """Optimizers built since tracking began (0: the script updates its parameters by hand, so far)."""
        self.on_new: Any = None
        """Called after an optimizer is built (step inference then looks for a new model's forwards)."""
        self.complete = False
        """Tracking began before any optimizer was built (zero-code tracing arms it when ``torch`` is
        imported): every live optimizer is known."""

    def track(self) -> None:
        """Wrap ``Optimizer.__init__`` (once): every optimizer built from now on is recorded."""
        if self._tracking:
            return
        self._tracking = True
        self.complete = not any(getattr(cls.__dict__.get("step"), "hooked", False)
                                for cls in optimizer_classes())  # torch marks a class at its first build
        original = torch.optim.Optimizer.__init__
        registry = self
        depth = [0]  # an optimizer built inside another's __init__ (ZeroRedundancyOptimizer's) is its part

        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            depth[0] += 1
            try:
                original(optimizer, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                registry.add(optimizer)
                if registry.on_new is not None:
                    registry.on_new()

        torch.optim.Optimizer.__init__ = __init__

    def add(self, optimizer: Any) -> None:
        self.built += 1
        key = id(optimizer)
        try:
            self._refs[key] = weakref.ref(optimizer, lambda _: self._gone(key))
        except TypeError:
            return
        self.ids.add(key)

    def _gone(self, key: int) -> None:
        self._refs.pop(key, None)
        self.ids.discard(key)

    def alive(self) -> list[Any]:
        """The recorded optimizers still alive."""
        return [optimizer for ref in list(self._refs.values()) if (optimizer := ref()) is not None]

    def forget(self, ids: set[int]) -> None:
        """Stop waiting for these optimizers (they exist but do not step)."""
        self.ids -= ids


def optimizer_classes() -> list[type]:
    """Every subclass of torch's ``Optimizer``, at any depth."""
    found: list[type] = []
    pending = list(torch.optim.Optimizer.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


OPTIMIZERS = OptimizerRegistry()
