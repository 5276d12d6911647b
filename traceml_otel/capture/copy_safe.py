"""Hooks that traceml puts on the user's own objects copy and pickle as no-ops.

A hook registered on a module or an optimizer lives in that object's hook dictionaries, so
``copy.deepcopy(model)`` (an EMA model, a distillation teacher, a "best model" snapshot) and a
whole-object pickle (``torch.save(model)``) copy the hook with it. A bound method of one of our
objects would drag the whole capture state along (recorder, locks, pipes: ``cannot pickle
'_thread.lock' object``). Each hook is therefore an instance of a :class:`CopySafeHook` subclass
whose ``__call__`` holds the timing logic (one Python frame per call, as a bound method), and whose
copies and pickles are :data:`INERT_HOOK`: the copy is not traced, the original still is.
"""

from __future__ import annotations

from typing import Any

INERT_HOOK: Any = None.__init__
"""What a copied or unpickled hook becomes: ``None.__init__``, a builtin that accepts any arguments
and returns ``None`` (a hook returning ``None`` changes nothing). A pickle of it is
``getattr(None, "__init__")``, so loading a pickled model needs no traceml-otel installed."""


class CopySafeHook:
    """A hook on a user's object; ``copy.copy``, ``copy.deepcopy`` and pickling give :data:`INERT_HOOK`.

    Subclasses define ``__slots__`` and ``__call__`` (with the hook's logic inline: the call is on the
    training thread every step).
    """

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return INERT_HOOK

    def __copy__(self) -> Any:
        return INERT_HOOK

    def __reduce__(self) -> tuple[Any, tuple[None, str]]:
        return getattr, (None, "__init__")
