"""What precision the program already trains in, seen once and off the per-step path.

The diagnosis's advice reads it: a loop already under ``torch.autocast``, or a model whose weights
are already half precision, is never told to try mixed precision.

- autocast: ``autocast.__enter__`` is wrapped until the first *enabled* autocast is entered, then
  the wrapper puts torch's own method back (one Python frame per autocast entry until then, none
  after; :meth:`AutocastWatch.uninstall` puts it back at shutdown if none was seen). The wrapper
  replaces the method on torch's base class, so ``torch.autocast``, ``torch.amp.autocast`` and the
  deprecated ``torch.cuda.amp.autocast`` are all seen; TorchDynamo handles autocast regions of a
  compiled function itself and never calls it there.
- weights: the first parameter's dtype of a model ``trace_step`` is given, checked when the traced
  model changes (at most :data:`MAX_MODELS_CHECKED` times).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

MAX_MODELS_CHECKED = 8
REDUCED = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
"""Parameter dtypes that are reduced precision, by their ``str``, and their short names."""


class AutocastWatch:
    """Report the first enabled autocast region once (``"autocast cuda bf16"``), then stop watching."""

    def __init__(self, seen: Callable[[str], None]) -> None:
        self._seen = seen
        self._lock = threading.Lock()
        self._owner: Any = None
        self._original: Any = None

    def install(self) -> bool:
        """Wrap ``autocast.__enter__``; ``False`` where torch has no autocast to watch."""
        try:
            from torch.amp import autocast_mode
        except ImportError:
            return False
        owner = autocast_mode.autocast
        original = owner.__dict__.get("__enter__")
        if original is None:
            return False
        watch = self

        def __enter__(self: Any) -> Any:  # the wrapped method's own name, in tracebacks
            if getattr(self, "_enabled", False):
                watch._found(self)
            return original(self)

        self._owner, self._original = owner, original
        owner.__enter__ = __enter__
        return True

    def _found(self, region: Any) -> None:
        if not self.uninstall():  # another thread saw one first
            return
        dtype = REDUCED.get(str(getattr(region, "fast_dtype", "")), str(getattr(region, "fast_dtype", "")))
        self._seen(f"autocast {getattr(region, 'device', '')} {dtype}".replace("  ", " ").strip())

    def uninstall(self) -> bool:
        """Put torch's method back; ``True`` when this call did it."""
        with self._lock:
            if self._owner is None:
                return False
            self._owner.__enter__ = self._original
            self._owner = self._original = None
            return True


def reduced_weights(model: Any) -> str:
    """``"bf16 weights"`` or ``"fp16 weights"`` when the model's first parameter is half precision,
    else ``""``."""
    try:
        parameter = next(iter(model.parameters()))
    except (AttributeError, StopIteration, TypeError):
        return ""
    name = REDUCED.get(str(getattr(parameter, "dtype", "")))
    return f"{name} weights" if name else ""
