"""Forward timing: the outermost forward of each traced model, from its class's call or from hooks.

A model traced by ``trace_step(model)`` or ``wrap_forward(model)`` is timed by its class's call: the
class's ``__call__`` becomes a wrapper that times the call when its module is one of the traced objects
(by identity: their ``id``s, each dropped when its model is collected) and passes any other instance (a
copy of the model, another module of that class) straight through. torch's module call then keeps its
fast path, as it would untraced: module hooks switch every call of the hooked module to its slow path (a
closure, hook-dict walks and an ``always_call`` set per call), which was a third of what telemetry added
to a small step (``benchmarks/step_instructions.py``). Nothing of ours lands on the instance: a
``copy.deepcopy`` or a pickle of the model is untraced and needs no traceml-otel to load. ``uninstall``
restores each class.

Step inference (zero-code tracing) times its roots the same way after its warm-up
(:meth:`ForwardHooks.watch_root`): the wrapper first runs inference's start for the root, which may
open the step, then starts the forward's clock. During the warm-up, and for roots that Dynamo
compiled, it uses hooks. A module that takes neither (a scripted TorchScript module) is refused once.
The two hooks torch keeps on a hooked model are :class:`CopySafeHook` objects: a copy or a pickle of
the model carries no-op hooks, never the capture state (``capture/copy_safe.py``).

A call of a traced model between steps is evaluation (:meth:`StepRecorder.forward_between_steps`):
the fetches it used from another loader than the training one are no step's input wait, whether or
not it runs under ``model.eval()`` or ``torch.no_grad()`` (``capture/training_loader.py``), and under
either, neither are the training loader's since the last step: an unmarked validation loop between
``trace_step`` blocks is time between steps, as step inference counts it. Only calls outside a step
pay for it.

Each wrapper and hook returns at once while Dynamo traces it (``torch.compiler.is_compiling()``, which
Dynamo folds to ``True`` without a guard): a traced module inside a ``torch.compile``d region (the user
compiled a wrapper, or called ``model.compile()``) compiles as if untraced, with no graph break and
no crash under ``fullgraph=True``; that forward is then not timed here.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from typing import Any

import torch
from torch._C import _current_graph_task_id
from torch.compiler import is_compiling

from traceml_otel.capture.copy_safe import CopySafeHook
from traceml_otel.capture.recorder import StepRecorder


def model_class(module: Any) -> str:
    """The class name a forward row carries: a DDP/FSDP/DataParallel wrapper's wrapped model's. Names
    are kept per class (a dictionary read per forward of a step with several models)."""
    cls = type(module)
    name = _CLASS_NAMES.get(cls)
    if name is None:
        if cls.__name__ in _WRAPPERS and isinstance(getattr(module, "module", None), torch.nn.Module):
            return type(module.module).__name__[:128]
        name = cls.__name__[:128]
        if len(_CLASS_NAMES) < 1024:
            _CLASS_NAMES[cls] = name
    return name


_WRAPPERS = frozenset(("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel"))
_CLASS_NAMES: dict[type, str] = {}


def in_backward() -> bool:
    """The autograd engine is running a backward on this thread: a forward called now is a
    recomputation (gradient checkpointing, reentrant or not) and belongs to backward."""
    return _current_graph_task_id() != -1


_UNTIMED = object()
"""What a module not timed by its class's call finds in :attr:`ForwardHooks._timed`."""


def _is_torch_layer(cls: type) -> bool:
    """One of torch's layer classes (``nn.Linear``, ``nn.Conv2d``...), called many times per step in
    most models: a model of such a class takes hooks, so that the other instances do not each pass
    through a wrapper of its class's call. Containers (``nn.Sequential``) and the DDP/FSDP wrappers are
    wrapped: a pass-through costs a few hundred instructions per other call, the hooks' slow path more
    than that on every traced call."""
    module = cls.__module__
    return module.startswith("torch.nn.modules.") and module != "torch.nn.modules.container"


class ForwardHooks:
    """Times the outermost forward of each traced model, by its class's call (or by module hooks).

    Only the models passed to ``trace_step``/``wrap_forward`` (and step inference's roots) are timed,
    not their sub-modules; a depth counter shared by all traced models ignores nested calls, e.g. a DDP
    wrapper and its ``.module`` both traced. See the module docstring for the two ways.
    """

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self._depth = 0
        self._token: tuple[int, Any] | None = None
        self._handles: weakref.WeakKeyDictionary[torch.nn.Module, list[Any]] = weakref.WeakKeyDictionary()
        self._timed: dict[int, Callable[[Any], None] | None] = {}
        """``id`` of each model timed by its class's call (dropped when the model is collected), with what
        its call runs first (step inference's root: the call may open a step), or ``None``."""
        self._wrapped_calls: dict[type, tuple[Any, Any]] = {}
        """Each wrapped class: its own ``__call__`` before (``None``: inherited), and the wrapper."""
        self.before_forward = _ForwardStart(self)
        """A module call starts (the forward pre-hook; also called directly by step inference)."""
        self.after_forward = _ForwardEnd(self)
        """A module call ends (the forward hook, also run when the call raised)."""
        self.named = False
        """More than one model runs in a step: each forward row carries its model's class (an eighth
        slot, ``traceml.module.class``). Set by :meth:`name_models`; one attribute read per forward."""

    def name_models(self, first: str | None = None) -> None:
        """A second model was found in a step: from now on each forward row carries its model's class;
        the open step's forwards so far are ``first``'s (the model that opened it), when given."""
        if self.named:
            return
        self.named = True
        recorder = self._recorder
        if first is not None and recorder.in_step:
            for row in recorder.state.phases:
                if row[0] == "forward" and len(row) == 7:
                    row.append(first)

    def watch(self, model: torch.nn.Module,
              on_refused: Callable[[torch.nn.Module], None] | None = None, *, by_call: bool = True) -> None:
        """Time ``model``'s outermost forward, once; later calls are a dictionary lookup.

        ``by_call``: by its class's call (``False``: by module hooks, as step inference's warm-up
        needs). A class whose call cannot be replaced, or a module that is not weakly referenceable,
        takes hooks.
        Torch refuses hooks on a scripted TorchScript module (``torch.jit.script``;
        ``torch.jit.trace``'s modules take hooks): nothing is timed then, ``on_refused(model)`` is
        called that once, and the refusal is kept: the model is not asked again, however often the
        traced model changes.
        """
        if model in self._handles:
            return
        if by_call and self._time_calls_of(model, None):
            self._handles[model] = [_TimedByCall(self, id(model))]
            return
        handles: list[Any] = []
        try:
            handles.append(model.register_forward_pre_hook(self.before_forward))
            handles.append(model.register_forward_hook(self.after_forward, always_call=True))
        except Exception:  # never a reason to stop the step or the training
            for handle in handles:
                handle.remove()
            self._handles[model] = []
            if on_refused is not None:
                on_refused(model)
            return
        self._handles[model] = handles

    def watch_root(self, root: torch.nn.Module, before: Callable[[Any], None]) -> Any:
        """Time step inference's ``root`` by its class's call, which runs ``before(root)`` first (it
        may open a step) and then starts the forward's clock; hooks the warm-up put on it go.

        Returns a handle whose ``remove()`` drops ``before`` (the root stays timed), or ``None`` when
        its class's call cannot time it (the caller hooks it instead)."""
        handles = self._handles.get(root)
        if (handles is not None and not handles) or not self._time_calls_of(root, before):
            return None  # (an empty list: it refused hooks before, a scripted module)
        for handle in handles or ():
            if not isinstance(handle, _TimedByCall):
                handle.remove()
        self._handles[root] = [_TimedByCall(self, id(root))]
        return _RootStart(self, id(root))

    def _time_calls_of(self, model: torch.nn.Module, before: Callable[[Any], None] | None) -> bool:
        """Wrap ``type(model).__call__`` (once per class) and add ``model`` to the timed ones."""
        cls = type(model)
        if (isinstance(model, torch.jit.ScriptModule) or not isinstance(model, torch.nn.Module)
                or _is_torch_layer(cls)):
            return False
        key = id(model)
        if key not in self._timed:
            try:
                weakref.finalize(model, self._timed.pop, key, None)
            except TypeError:  # not weakly referenceable: an id could then outlive its model
                return False
        if cls not in self._wrapped_calls:
            own = cls.__dict__.get("__call__")
            wrapper = self._timed_call(cls, own)
            try:
                cls.__call__ = wrapper
            except (TypeError, AttributeError):  # a class that takes no new attributes
                return False
            self._wrapped_calls[cls] = own, wrapper
        self._timed[key] = before
        return True

    def _timed_call(self, cls: type, own: Any) -> Callable[..., Any]:
        """``cls.__call__`` timed as an outermost forward for the traced instances of ``cls``."""
        hooks = self  # the only capture state in the closure (a by-value pickle gets a stand-in)
        # With no call of its own, the one it inherits: read from the class that defines it on every call
        # (usually nn.Module, whose __call__ torch.fx patches while it traces)
        base = next((k for k in cls.__mro__[1:] if "__call__" in k.__dict__), torch.nn.Module)

        def traceml_timed_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            call = base.__call__ if own is None else own
            if is_compiling():  # traced by Dynamo: compile nothing of ours
                return call(module, *args, **kwargs)
            before = hooks._timed.get(id(module), _UNTIMED)
            if before is _UNTIMED:  # another instance of the class (a copy), or not traced any more
                return call(module, *args, **kwargs)
            if before is not None:
                before(module)
            recorder = hooks._recorder
            owner = recorder.owner
            if owner is not None and get_ident() != owner:  # another thread: untimed, counted in a step
                try:
                    return call(module, *args, **kwargs)
                finally:
                    if recorder.in_step:
                        recorder.other_thread_phases += 1
            depth = hooks._depth = hooks._depth + 1
            if depth == 1:  # (a recomputation inside backward is backward's: no forward phase)
                hooks._token = (perf_counter_ns(), (  # phase_begin(), inline
                    recorder.clock.mark() if recorder.in_step and recorder.device else None)
                ) if _current_graph_task_id() == -1 else None
            try:
                return call(module, *args, **kwargs)
            finally:
                depth = hooks._depth - 1
                if depth > 0:
                    hooks._depth = depth
                else:
                    hooks._depth = 0
                    token = hooks._token
                    if token is not None:
                        hooks._token = None
                        if recorder.in_step:
                            if hooks.named:  # several models: the row names its model's class
                                recorder.phase_done("forward", token, module=model_class(module))
                            else:
                                recorder.phase_done("forward", token)
                        else:
                            recorder.clock.release(token[1])  # evaluation between steps
                            recorder.forward_between_steps(module.training and torch.is_grad_enabled())

        return traceml_timed_forward

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """A class whose call is wrapped, pickled by value (cloudpickle or dill pickle a class of
        ``__main__`` that way), carries the wrapper's closure: it gets a stand-in that times nothing,
        so the unpickled class's calls pass straight through (loading it needs traceml-otel)."""
        return _untimed_hooks, ()

    def watches(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is timed (or was refused) already."""
        return model in self._handles

    @property
    def in_forward(self) -> bool:
        """An outermost forward is open (its pre-hook ran, its hook has not yet)."""
        return self._depth > 0

    def timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` timed as an outermost forward (a framework's training-step method)."""
        hooks = self

        @functools.wraps(call)
        def traceml_timed_forward(*args: Any, **kwargs: Any) -> Any:
            hooks.before_forward(None, args)
            try:
                return call(*args, **kwargs)
            finally:
                hooks.after_forward(None, args, None)

        return traceml_timed_forward

    def install(self) -> None:
        """Nothing global: models are timed as they are traced."""

    def uninstall(self) -> None:
        for handles in list(self._handles.values()):
            for handle in handles:
                handle.remove()
        self._handles = weakref.WeakKeyDictionary()
        for cls, (own, wrapper) in self._wrapped_calls.items():
            if cls.__dict__.get("__call__") is not wrapper:  # replaced since by someone else: theirs stays
                continue
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own  # type: ignore[method-assign]
        self._wrapped_calls = {}
        self._timed.clear()


class _NoSteps:
    """The sink of a stand-in recorder, which never records a step."""

    def send_steps(self, rows: list[list[Any]]) -> None:
        """Nothing is sent."""


def _untimed_hooks() -> ForwardHooks:
    """What a pickled :class:`ForwardHooks` loads as: no model timed, no capture state."""
    return ForwardHooks(StepRecorder(_NoSteps()))


class _TimedByCall:
    """The handle of a model timed by its class's call: ``remove()`` stops timing it."""

    __slots__ = ("_hooks", "_key")

    def __init__(self, hooks: ForwardHooks, key: int) -> None:
        self._hooks = hooks
        self._key = key

    def remove(self) -> None:
        self._hooks._timed.pop(self._key, None)


class _RootStart(_TimedByCall):
    """The handle of a root's ``before``: ``remove()`` drops it, and the root stays timed."""

    __slots__ = ()

    def remove(self) -> None:
        if self._key in self._hooks._timed:
            self._hooks._timed[self._key] = None


class _ForwardStart(CopySafeHook):
    """``ForwardHooks.before_forward``: the outermost module call opens a forward phase."""

    __slots__ = ("_hooks", "_recorder")

    def __init__(self, hooks: ForwardHooks) -> None:
        self._hooks = hooks
        self._recorder = hooks._recorder

    def __call__(self, module: torch.nn.Module | None, args: Any) -> None:
        if is_compiling():  # traced by Dynamo: compile nothing of ours (see the module docstring)
            return
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            return
        hooks = self._hooks
        depth = hooks._depth = hooks._depth + 1
        if depth == 1:  # (a recomputation inside backward is backward's: no forward phase)
            hooks._token = (perf_counter_ns(), (  # phase_begin(), inline
                recorder.clock.mark() if recorder.in_step and recorder.device else None)
            ) if _current_graph_task_id() == -1 else None


class _ForwardEnd(CopySafeHook):
    """``ForwardHooks.after_forward``: the outermost module call's end closes the forward phase."""

    __slots__ = ("_hooks", "_recorder")

    def __init__(self, hooks: ForwardHooks) -> None:
        self._hooks = hooks
        self._recorder = hooks._recorder

    def __call__(self, module: torch.nn.Module | None, args: Any, output: Any) -> None:
        if is_compiling():
            return
        recorder = self._recorder
        owner = recorder.owner
        if owner is not None and get_ident() != owner:
            if recorder.in_step:
                recorder.other_thread_phases += 1
            return
        hooks = self._hooks
        depth = hooks._depth - 1
        if depth > 0:
            hooks._depth = depth
            return
        hooks._depth = 0
        token = hooks._token
        if token is not None:
            hooks._token = None
            phases = recorder.state.phases
            calls = len(phases)
            recorder.phase_done("forward", token)
            if hooks.named and module is not None and len(phases) > calls:
                phases[calls].append(model_class(module))
            if not recorder.in_step and module is not None:  # evaluation between steps
                recorder.forward_between_steps(module.training and torch.is_grad_enabled())
