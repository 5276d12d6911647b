"""An eager entry for modules compiled in place (``model.compile()``), under step inference.

``model.compile()`` compiles the module's whole call, its hooks and torch's global module hooks
included: inside, every hook of ours returns at once (``torch.compiler.is_compiling()``), so no hook
sees that module's calls. What torch calls eagerly is ``module._compiled_call_impl``: zero-code
tracing wraps it (``Module.compile`` patched when it arms) in :class:`InPlaceCompiledCall`, which
hands each call to :data:`LISTENER` (step inference) before the compiled code runs. Copies drop it:
torch's ``Module.__getstate__`` leaves ``_compiled_call_impl`` out of a deepcopy or pickle.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.compiler import is_compiling

InPlaceHandler = Callable[[torch.nn.Module, Callable[..., Any], tuple, dict], Any]


class _Listener:
    """Who is told of each call of a module compiled in place (None: nobody, the call runs as is)."""

    call: InPlaceHandler | None = None


LISTENER = _Listener()


class InPlaceCompiledCall:
    """Stands in for ``module._compiled_call_impl``: tells :data:`LISTENER`, which runs the call."""

    __slots__ = ("_module", "compiled")

    def __init__(self, module: torch.nn.Module, compiled: Callable[..., Any]) -> None:
        self._module = weakref.ref(module)  # the compiled function already holds the module
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handler = LISTENER.call
        module = self._module()
        if handler is None or module is None or is_compiling():
            return self.compiled(*args, **kwargs)
        return handler(module, self.compiled, args, kwargs)


def patch_module_compile() -> None:
    """Wrap what ``Module.compile`` leaves on the module in an :class:`InPlaceCompiledCall` (once)."""
    original = torch.nn.Module.compile
    if getattr(original, "traceml_patched", False):
        return

    @functools.wraps(original)
    def compile(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        original(module, *args, **kwargs)
        compiled = module.__dict__.get("_compiled_call_impl")
        if compiled is not None and not isinstance(compiled, InPlaceCompiledCall):
            module._compiled_call_impl = InPlaceCompiledCall(module, compiled)

    compile.traceml_patched = True  # type: ignore[attr-defined]
    torch.nn.Module.compile = compile
