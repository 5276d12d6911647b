"""Collective timing: DDP's gradient all-reduce and ``torch.distributed`` calls made inside a step.

Two hooks feed :meth:`StepRecorder.collective_begin` / ``collective_end``:

- :class:`DdpGradientTiming` registers a DDP communication hook on each ``DistributedDataParallel``
  model (built after ``init()``, or traced). The hook runs DDP's own default (``allreduce_hook``) or the
  hook the program registers later, marks the bucket's start, and chains a ``then`` callback that
  marks its completion. On CPU (gloo) the marks are CPU clock readings taken when the bucket is
  handed over and when the future completes; on CUDA they are also events on the current stream
  (inside ``then`` that stream is synchronised with the collective), so the device time is measured
  without ever synchronising.
- :class:`CollectiveCallPatch` wraps the collectives of the ``torch.distributed`` namespace
  (``all_reduce``, ``barrier``, ``all_gather_into_tensor``, ...). A synchronous call blocks its
  caller for all of its time, so all of it is exposed; an ``async_op=True`` call is timed until its
  future completes, and its exposed part is not known.

Calls made by the DDP hook itself, or nested in another timed call, count once. Everything is best
effort: a hook that cannot be installed leaves training untouched and is reported once.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

from traceml_otel.capture.progress import DEFAULT_GROUP, CollectiveProgress, group_name
from traceml_otel.capture.recorder import StepRecorder

Warn = Callable[[str], None]

SOURCE_DDP = "ddp"
"""DDP's gradient buckets (the communication hook)."""
SOURCE_API = "api"
"""A ``torch.distributed`` call: the program's own, or one made by a library such as FSDP."""

KIND_CUSTOM = "custom"
"""A DDP communication hook the program registered: we time it, but cannot say which collective it runs."""

# name in torch.distributed -> (kind, index of the positional payload argument, its keyword name)
COLLECTIVES: dict[str, tuple[str, int | None, str]] = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "all_reduce_coalesced": ("all_reduce", 0, "tensors"),
    "broadcast": ("broadcast", 0, "tensor"),
    "broadcast_object_list": ("broadcast", None, ""),
    "reduce": ("reduce", 0, "tensor"),
    "all_gather": ("all_gather", 1, "tensor"),
    "all_gather_into_tensor": ("all_gather", 1, "input_tensor"),
    "all_gather_single": ("all_gather", 1, "input_tensor"),
    "all_gather_object": ("all_gather", None, ""),
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "all_to_all": ("all_to_all", 1, "input_tensor_list"),
    "all_to_all_single": ("all_to_all", 1, "input"),
    "gather": ("gather", 0, "tensor"),
    "scatter": ("scatter", 0, "tensor"),
    "barrier": ("barrier", None, ""),
    "monitored_barrier": ("barrier", None, ""),
}
"""The collectives timed, and which argument is this rank's payload (its bytes are reported; the
``*_object`` calls pickle Python objects, whose size is not known, and report 0 bytes)."""


def payload_bytes(value: Any) -> int:
    """Bytes of a tensor or a list of tensors (0 for anything else)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(item) for item in value)
    return 0


class _Nesting:
    """How deep the current collective timing is: nested calls (a hook's all_reduce) count once."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0


def _finished(recorder: StepRecorder, token: Any, future: Any) -> Any:
    """``then`` callback: mark the collective's completion and pass its value (or error) through."""
    if token is not None:
        recorder.collective_end(token)
    return future.value()


def _left(progress: CollectiveProgress, entry: list[Any], then: Callable[[Any], Any], future: Any) -> Any:
    """``then`` callback: the bucket's collective is no longer in flight; then the timing callback."""
    progress.leave(entry)
    return then(future)


def _completed(recorder: StepRecorder, token: Any, future: Any) -> None:
    recorder.collective_end(token)


def _reduced(future: Any) -> Any:
    return future.value()[0]


def _finished_reduced(recorder: StepRecorder, token: Any, future: Any) -> Any:
    if token is not None:
        recorder.collective_end(token)
    return future.value()[0]


class _GradientHookState:
    """The state DDP hands our communication hook: the hook it wraps and that hook's state."""

    def __init__(self, recorder: StepRecorder, nesting: _Nesting, hook: Callable[..., Any], state: Any,
                 kind: str, progress: CollectiveProgress | None = None, group: str = DEFAULT_GROUP) -> None:
        self.recorder = recorder
        self.progress = progress
        """Counts each bucket's collective on ``group`` for the hang watchdog."""
        self.group = group
        self.nesting = nesting
        self.hook = hook
        self.state = state
        self.kind = kind
        self.default_group: Any = None
        """Set while DDP's default applies: the process group to average the gradients over."""

    def run(self, bucket: Any) -> Any:
        recorder = self.recorder
        tensor = bucket.buffer()
        nbytes = tensor.numel() * tensor.element_size()
        token = recorder.collective_begin(self.kind, SOURCE_DDP, nbytes, False)
        progress = self.progress
        entry = progress.enter(self.kind, self.group, SOURCE_DDP) if progress is not None else None
        group = self.default_group
        if group is not None and not tensor.is_complex():
            # DDP's default (allreduce_hook: average, then all-reduce), straight on the process group:
            # the torch.distributed wrapper and a second ``then`` cost ~30 us per bucket here.
            tensor.div_(group.size())
            future = group.allreduce([tensor]).get_future()
            then = _reduced if token is None else functools.partial(_finished_reduced, recorder, token)
        else:
            self.nesting.depth += 1
            try:
                future = self.hook(self.state, bucket)
            finally:
                self.nesting.depth -= 1
            if token is None and entry is None:
                return future
            then = functools.partial(_finished, recorder, token)
        if entry is not None:
            then = functools.partial(_left, progress, entry, then)
        return future.then(then)


def timed_gradient_hook(state, bucket):
    """The DDP communication hook traceml registers: times ``state.hook`` for each gradient bucket.

    Unannotated on purpose: DDP rejects a hook whose ``bucket`` annotation is not ``dist.GradBucket``.
    """
    return state.run(bucket)


class DdpGradientTiming:
    """Registers :func:`timed_gradient_hook` on each DDP model it is shown (once per model).

    DDP accepts one communication hook per model. A hook the program registers *after* ours is
    run inside ours (``register_comm_hook`` is redirected on that model); one registered before ours
    (on a model built before ``init()``) cannot be wrapped, and its buckets are not timed (reported once).
    """

    def __init__(self, recorder: StepRecorder, nesting: _Nesting, warn: Warn,
                 progress: CollectiveProgress | None = None) -> None:
        self._recorder = recorder
        self._nesting = nesting
        self._warn = warn
        self._progress = progress
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._warned: set[str] = set()

    def _note(self, reason: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            self._warn(f"DDP gradient buckets are not timed: {reason}. Collectives the hook calls through "
                       "torch.distributed are still timed, without their exposed part (training continues)")

    def watch(self, model: Any) -> bool:
        """Time ``model``'s gradient buckets if it is a DDP model; True when the hook is in place."""
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel) or model in self._seen:
            return False
        self._seen.add(model)
        if getattr(model, "_comm_hooks", None):
            names = ", ".join(getattr(hook, "__qualname__", "?") for hook, _ in model._comm_hooks)
            self._note(f"the model already has a communication hook ({names}); register it after the "
                       "first traced step, or after traceml's, to have it timed")
            return False
        try:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            group = model.process_group
            state = _GradientHookState(self._recorder, self._nesting, allreduce_hook, group, "all_reduce",
                                       self._progress, group_name(group))
            if callable(getattr(group, "allreduce", None)) and callable(getattr(group, "size", None)):
                state.default_group = group
            model.register_comm_hook(state, timed_gradient_hook)
        except Exception as error:
            self._note(f"the communication hook could not be registered ({type(error).__name__}: {error})")
            return False
        self._redirect_registration(model, state)
        return True

    def _redirect_registration(self, model: Any, state: _GradientHookState) -> None:
        """A hook the program registers later replaces the default one inside ours."""

        def register_comm_hook(hook_state: object, hook: Callable[..., Any]) -> None:
            model._check_comm_hook(hook)
            state.hook, state.state, state.kind = hook, hook_state, KIND_CUSTOM
            state.default_group = None

        def register_builtin_comm_hook(comm_hook_type: Any) -> None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            name = getattr(comm_hook_type, "name", str(comm_hook_type))
            builtin = {"ALLREDUCE": default_hooks.allreduce_hook,
                       "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(name)
            if builtin is None:
                raise RuntimeError(f"traceml: cannot run built-in DDP hook {name} inside its timing hook; "
                                   "turn collective timing off (TRACEML_COLLECTIVES=0)")
            state.hook, state.state, state.kind = builtin, model.process_group, "all_reduce"
            state.default_group = None

        model.register_comm_hook = register_comm_hook
        model._register_builtin_comm_hook = register_builtin_comm_hook


class CollectiveCallPatch:
    """Times the collectives of the ``torch.distributed`` namespace called inside a step."""

    def __init__(self, recorder: StepRecorder, nesting: _Nesting,
                 progress: CollectiveProgress | None = None) -> None:
        self._recorder = recorder
        self._nesting = nesting
        self._progress = progress or CollectiveProgress()
        self._originals: dict[str, Any] = {}

    def _timed(self, original: Callable[..., Any], kind: str, payload: int | None, keyword: str) -> Any:
        nesting, progress = self._nesting, self._progress
        parameters = list(inspect.signature(original).parameters)
        async_index = parameters.index("async_op") if "async_op" in parameters else None
        group_index = parameters.index("group") if "group" in parameters else None

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if nesting.depth:
                return original(*args, **kwargs)
            positional = group_index is not None and len(args) > group_index
            group = kwargs.get("group", args[group_index] if positional else None)  # type: ignore[index]
            entry = progress.enter(kind, DEFAULT_GROUP if group is None else group_name(group), SOURCE_API)
            try:
                return self._call(original, kind, payload, keyword, async_index, args, kwargs)
            finally:  # an async call's completion is not followed: its wait() is the program's
                progress.leave(entry)

        timed.__traceml_original__ = original  # type: ignore[attr-defined]
        return timed

    def _call(self, original: Callable[..., Any], kind: str, payload: int | None, keyword: str,
              async_index: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the collective, timed when inside a step."""
        recorder, nesting = self._recorder, self._nesting
        if not recorder.in_step:
            return original(*args, **kwargs)
        asynchronous = bool(kwargs.get("async_op", async_index is not None and len(args) > async_index
                                       and args[async_index]))
        nbytes = 0
        if payload is not None:
            nbytes = payload_bytes(args[payload] if len(args) > payload else kwargs.get(keyword))
        # A blocking call on a side stream (FSDP's) overlaps compute on the device: not known exposed.
        blocking = not asynchronous and recorder.clock.on_default_stream()
        token = recorder.collective_begin(kind, SOURCE_API, nbytes, blocking)
        if token is None:
            return original(*args, **kwargs)
        nesting.depth += 1
        try:
            result = original(*args, **kwargs)
        except BaseException:
            recorder.collective_end(token)
            raise
        finally:
            nesting.depth -= 1
        if asynchronous and result is not None:
            try:
                result.get_future().then(functools.partial(_completed, recorder, token))
            except Exception:  # a backend without futures: the completion stays unknown
                pass
        else:
            recorder.collective_end(token)
        return result

    def install(self) -> None:
        import torch.distributed as dist

        if self._originals or not dist.is_available():
            return
        for name, (kind, payload, keyword) in COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None or hasattr(original, "__traceml_original__"):
                continue
            self._originals[name] = original
            setattr(dist, name, self._timed(original, kind, payload, keyword))

    def uninstall(self) -> None:
        import torch.distributed as dist

        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}


class CollectiveTiming:
    """Both collective hooks, sharing one nesting counter: what ``init()`` installs.

    DDP models built after ``install()`` get the timing hook as soon as DDP's constructor returns,
    so a communication hook the program registers right after building the model runs inside it;
    models built before are hooked at their first traced step (:meth:`watch`).
    """

    def __init__(self, recorder: StepRecorder, warn: Warn) -> None:
        nesting = _Nesting()
        self.progress = CollectiveProgress()
        """Collectives entered per process group, and those in flight (read by the hang watchdog)."""
        self.calls = CollectiveCallPatch(recorder, nesting, self.progress)
        self.ddp = DdpGradientTiming(recorder, nesting, warn, self.progress)
        self._warn = warn
        self._ddp_init: Any = None

    def install(self) -> None:
        self.calls.install()
        if self._ddp_init is None:
            ddp_class = torch.nn.parallel.DistributedDataParallel
            original = self._ddp_init = ddp_class.__init__
            watch, warn = self.ddp.watch, self._warn

            @functools.wraps(original)
            def init_then_watch(model: Any, *args: Any, **kwargs: Any) -> None:
                original(model, *args, **kwargs)
                try:
                    watch(model)
                except Exception as error:  # never break the program's DDP construction
                    warn(f"DDP gradient buckets are not timed: {type(error).__name__}: {error}")

            ddp_class.__init__ = init_then_watch

    def uninstall(self) -> None:
        self.calls.uninstall()
        if self._ddp_init is not None:
            torch.nn.parallel.DistributedDataParallel.__init__ = self._ddp_init
            self._ddp_init = None

    def watch(self, model: Any) -> None:
        """Time a traced model's gradient synchronisation when it is a DDP model."""
        self.ddp.watch(model)
