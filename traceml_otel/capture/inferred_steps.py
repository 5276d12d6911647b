"""Step inference: the steps of a plain training loop that never calls ``trace_step``.

Under zero-code tracing (``traceml run``), a loop without ``trace_step`` is cut into steps from its
own calls, one step per optimizer update:

- a step **ends** when the outermost ``optimizer.step()`` of the update returns (Accelerate's
  ``AcceleratedOptimizer.step`` included; its gradient-accumulation no-ops are no update). With
  several optimizers alive (a GAN), a step ends once each of them has stepped (one warning says so).
  While no optimizer has been built (a loop that updates its parameters by hand), a step ends when
  its backward returns;
- the next step **starts** at the end of the last batch fetch before the next training forward (so
  the fetch is that step's input wait, as with ``for batch in loader: with trace_step(): ...``),
  or at that forward when nothing was fetched;
- a training forward is the outermost module call with gradients enabled, outside
  ``inference_mode``, of a module in ``train()`` mode. Any other forward between updates is
  evaluation: it opens no step, and the batches fetched for it are no step's input wait.

Phases come from the usual hooks (backward, optimizer, fetches), plus the forward of each module
seen as the outermost training call. Finding those takes global module hooks, which run for every
module call; after a few steps they are replaced by those modules' own timing (their class's call,
or hooks on them alone: ``capture/forward_hooks.py``). Any explicit step
(``trace_step``, a framework callback) stops inference for the rest of the run. What starts it at the
loop's first fetch or forward: :mod:`traceml_otel.capture.inference_arming`.

``torch.compile``: every hook here returns at once while Dynamo traces it (``is_compiling()``), so
none of them is compiled into a model's graph. A ``torch.compile(module)`` wrapper compiles its module
on its first call, after the global pre-hook ran: when that hook sees such a wrapper, the warm-up
ends there (its roots hooked, the global hooks removed before the compile), and global hooks are never
installed again, so the compiled code never sees them change and never recompiles for them. A
module compiled in place (``model.compile()``) is seen by no hook at all: its eager entry
(``capture/compiled_in_place.py``) calls :meth:`InferredSteps.in_place_call` instead.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.compiler import is_compiling

from traceml_otel.capture.compiled_in_place import LISTENER
from traceml_otel.capture.copy_safe import CopySafeHook
from traceml_otel.capture.forward_hooks import in_backward
from traceml_otel.capture.optimizer_registry import OPTIMIZERS

if TYPE_CHECKING:
    from traceml_otel.capture.capture_config import CaptureConfig
    from traceml_otel.capture.forward_hooks import ForwardHooks
    from traceml_otel.capture.optimizer_hooks import OptimizerHooks
    from traceml_otel.capture.recorder import StepRecorder

WARM_UP_STEPS = 3
"""Steps timed with global module hooks before only the modules found then are hooked."""


class InferenceHost(Protocol):
    """What step inference needs of the training session (``capture/session.py``'s ``TrainingSession``)."""

    config: CaptureConfig | None
    recorder: StepRecorder
    forward: ForwardHooks | None
    optimizer_hooks: OptimizerHooks
    inferred: InferredSteps | None
    internal_errors: int

    def model_seen(self, model: Any) -> None:
        """``model`` is the one traced now: its forward hooks, parallelism and collectives."""

    def count_internal_error(self) -> None:
        """An error of our own was caught on the training thread."""


def _warn(message: str) -> None:
    print(f"traceml: {message}", file=sys.stderr, flush=True)


def optimizer_of(optimizer: Any, args: Any) -> Any:
    """The torch optimizer behind an outermost step call (Accelerate's wrapper holds it in ``.optimizer``);
    ``optimizer`` may be a weak reference to it (a ``step`` held on the instance)."""
    candidate = optimizer if optimizer is not None else (args[0] if args else None)
    if type(candidate) is weakref.ref:
        candidate = candidate()
    inner = getattr(candidate, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else candidate


class InferredSteps:
    """Opens and closes the recorder's steps from a plain loop's fetches, forwards and updates."""

    def __init__(self, session: InferenceHost) -> None:
        self._session = session
        self._recorder = session.recorder
        self._pending_start: int | None = None
        self._depth = 0
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._hooked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._global_handles: list[Any] = []
        self._outermost: torch.nn.Module | None = None
        self._timing = False
        """The outermost call in progress is timed as forward (a module with parameters)."""
        """The module of the outermost call in progress, while global hooks run."""
        self._compiled = False
        """A ``torch.compile(module)`` wrapper was seen: global module hooks stay off for good."""
        self._root_handles: list[Any] = []
        self._stepped: set[int] = set()
        self._steps = 0
        self._warned_optimizers = False
        self._root_hook = _RootForwardStart(self)
        """The pre-hook on each root after the warm-up (a copy of a root gets a no-op, not this)."""
        self._root_start = functools.partial(self._outermost_call, known=True)
        """What a root's class call runs first, before the forward's clock (the call may open a step)."""
        self.active = False

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Hook the loop: fetches, outermost forwards (global module hooks) and updates."""
        session = self._session
        if session.config is None or not session.config.optimizer:
            return
        hooks = session.optimizer_hooks
        hooks.after_update = self._updated
        scaler_hooks = getattr(session, "scaler_hooks", None)
        if scaler_hooks is not None:
            scaler_hooks.after_skip = self._updated  # a skipped update ends its step too
        self._recorder.after_fetch = self._fetched
        self._recorder.source = "inferred"
        self._hook_every_module()
        OPTIMIZERS.track()
        OPTIMIZERS.on_new = self._new_optimizer
        LISTENER.call = self.in_place_call
        if not OPTIMIZERS.built:  # no optimizer (yet): parameters updated by hand, a step per backward
            self._recorder.on_nested_phase = self._phase_without_optimizer
        self.active = True

    def _phase_without_optimizer(self) -> None:
        """A phase ended while no optimizer exists (the loop updates its parameters by hand): a step
        ends with its backward, so the update and the next fetch fall between steps, as they would
        after ``optimizer.step()``. The recorder calls this after each forward and backward phase
        (its hook for phases nested in an optimizer call, free while there is none)."""
        try:
            recorder = self._recorder
            forward = self._session.forward
            if recorder.last_phase != "backward" or (forward is not None and forward.in_forward):
                return
            recorder.end_step()
            self._step_ended()
        except Exception as error:  # never raised into the user's backward
            self._ignored(error)

    def _step_ended(self) -> None:
        self._steps += 1
        if self._steps == WARM_UP_STEPS and self._global_handles:
            self._hook_roots_only()

    def _updates_end_steps(self) -> None:
        """Steps no longer end at a backward (an optimizer exists now, or explicit steps took over)."""
        if self._recorder.on_nested_phase == self._phase_without_optimizer:
            self._recorder.on_nested_phase = None

    def _new_optimizer(self) -> None:
        """A new optimizer usually means a new model to train: look for its forwards again. Its
        updates end the steps from now on."""
        if not self.active:
            return
        self._updates_end_steps()
        if not self._global_handles and not self._compiled:
            self._hook_every_module()

    def _hook_every_module(self) -> None:
        """Global module hooks: find the outermost training forwards (during a warm-up)."""
        from torch.nn.modules import module as module_hooks

        self._steps = 0
        self._global_handles = [
            module_hooks.register_module_forward_pre_hook(self._global_pre),
            module_hooks.register_module_forward_hook(self._global_post, always_call=True),
        ]

    def stop(self) -> None:
        """An explicit step takes over (or the configuration changed): stop inferring, drop an open step."""
        if not self.active:
            return
        self.active = False
        OPTIMIZERS.on_new = None
        if LISTENER.call == self.in_place_call:
            LISTENER.call = None
        self._remove(self._global_handles)
        self._remove(self._root_handles)
        session = self._session
        if session.optimizer_hooks.after_update == self._updated:
            session.optimizer_hooks.after_update = None
        scaler_hooks = getattr(session, "scaler_hooks", None)
        if scaler_hooks is not None and scaler_hooks.after_skip == self._updated:
            scaler_hooks.after_skip = None
        self._recorder.after_fetch = None
        self._updates_end_steps()  # explicit steps end where their blocks end
        self._recorder.cancel_step()
        self._recorder.source = "trace_step"
        if session.inferred is self:
            session.inferred = None

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        while handles:
            handles.pop().remove()

    # --- what the loop does ---------------------------------------------------------
    def _fetched(self, end_ns: int) -> None:
        """A batch was fetched between steps: the next step may start here."""
        self._pending_start = end_ns

    def _global_pre(self, module: torch.nn.Module, args: Any) -> None:
        if is_compiling():  # traced by Dynamo (a module compiled in place): compile nothing of ours
            return
        self._depth += 1
        if self._depth == 1:
            self._outermost = module
            self._outermost_call(module)
            forward = self._session.forward
            # a module without parameters (a loss) is no model's forward (``model_discovery.py``'s rule)
            self._timing = forward is not None and _has_parameters(module)
            if self._timing:
                forward.before_forward(module, args)
        if _is_compiled_wrapper(module):
            self._compiled_wrapper_called(module)

    def _global_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if is_compiling():
            return
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self._outermost = None
            forward = self._session.forward
            if forward is not None and self._timing:
                self._timing = False
                forward.after_forward(module, args, output)

    def _compiled_wrapper_called(self, wrapper: torch.nn.Module) -> None:
        """A ``torch.compile(module)`` wrapper is called and compiles next: end the warm-up now.

        Its module is compiled after this pre-hook returns, against the global hooks present then;
        removing them later would fail the compiled code's guards (a recompile). So the outermost
        module of this call (the wrapper, or a module that calls it) becomes a root now, the roots
        found so far are hooked, and the global hooks go before the compile. ``_global_post`` will
        not run for the calls in progress: the roots' own forward hooks end this forward."""
        self._compiled = True
        outermost = self._outermost if self._outermost is not None else wrapper
        self._outermost = None
        self._depth = 0
        if outermost not in self._roots:  # an evaluation call too: no later call would find it
            self._roots.add(outermost)
            self._session.model_seen(outermost)
        self._hook_roots_only()

    def in_place_call(self, module: torch.nn.Module, compiled: Callable[..., Any], args: tuple,
                      kwargs: dict) -> Any:
        """A call of a module compiled in place (``model.compile()``), where no hook sees it: its
        eager entry (``capture/compiled_in_place.py``) does what the root hooks would do."""
        forward = self._session.forward
        nested = self._depth > 0 or (forward is not None and forward.in_forward)
        if self._global_handles:  # it compiles next, against the global hooks there are: none
            self._compiled_wrapper_called(module)
        self._compiled = True
        if not nested:
            self._outermost_call(module, known=module in self._roots)
        if forward is None:
            return compiled(*args, **kwargs)
        forward.before_forward(module, args)
        try:
            return compiled(*args, **kwargs)
        finally:
            forward.after_forward(module, args, None)

    def _ignored(self, error: Exception) -> None:
        """An error of ours while inferring steps: said once with its type, counted, never raised."""
        if not self._session.internal_errors:
            _warn(f"step inference ignored {type(error).__name__}: {str(error)[:160]!r}")
        self._session.count_internal_error()

    def _outermost_call(self, module: torch.nn.Module, known: bool = False) -> None:
        try:
            recorder = self._recorder
            training = module.training and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            if recorder.in_step:
                # A second model trained in the step (a GAN's discriminator): time its forwards after the
                # warm-up too. Modules without parameters (a loss module) are no model.
                if (training and not known and module not in self._roots and _has_parameters(module)
                        and not in_backward()):  # (checkpointing's recomputation is backward)
                    self._roots.add(module)
                    self._session.model_seen(module)
                    forward = self._session.forward
                    if forward is not None:  # a second model: each forward row names its model
                        forward.name_models()
                return
            if training and recorder.loaders.last is not None:  # another loader's batch than the training
                self._other_loaders_batch(module, known)      # one's came last (capture/training_loader.py)
            elif training:
                if not known and module not in self._roots:
                    self._roots.add(module)
                    self._session.model_seen(module)  # forward hooks, parallelism, collectives
                start, self._pending_start = self._pending_start, None
                recorder.begin_step(start_ns=start)
            elif not recorder.outside:  # evaluation between updates: its fetches feed no step
                self._pending_start = None
                recorder.forward_between_steps(False)
        except Exception as error:  # never raised into the user's forward or update
            self._ignored(error)

    def _other_loaders_batch(self, module: torch.nn.Module, known: bool) -> None:
        """A training forward between steps after a fetch from a loader not known as the training one:
        evaluation's loader (no step), a loader seen for the first time (a tentative step, until it
        fetches again before a backward), or the first step's (a step)."""
        recorder = self._recorder
        batch = recorder.loaders.last_batch()
        if batch == "evaluation":
            self._pending_start = None
            recorder.forward_between_steps(True)
            return
        if not known and module not in self._roots:
            self._roots.add(module)
            self._session.model_seen(module)
        start, self._pending_start = self._pending_start, None
        if batch == "unknown":
            recorder.open_tentatively(start)
        else:
            recorder.begin_step(start_ns=start)

    def _updated(self, optimizer: Any, args: Any) -> None:
        """The outermost optimizer call returned: the step ends once every live optimizer stepped."""
        try:
            recorder = self._recorder
            stepped = optimizer_of(optimizer, args)
            if not recorder.in_step:  # no training forward seen (a new model, or a functional one)
                start = self._pending_start if self._pending_start is not None else recorder.last_step_end_ns
                self._pending_start = None
                recorder.begin_step(start_ns=start)
                recorder.optimizer_stepped()
                if not self._global_handles and not self._compiled:  # look for the new model's forwards again
                    self._hook_every_module()
            if not self._iteration_done(id(stepped)):
                return
            self._stepped.clear()
            recorder.end_step()
            self._step_ended()
        except Exception as error:  # never raised into the user's forward or update
            self._ignored(error)

    def _iteration_done(self, stepped: int) -> bool:
        live = OPTIMIZERS.ids
        if len(live) <= 1 or stepped not in live:
            return True
        if stepped in self._stepped:  # stepped twice while others did not: those are idle
            missing = live - self._stepped
            OPTIMIZERS.forget(missing)
            self._stepped.clear()
            _warn(f"{len(missing)} optimizer(s) that exist did not step while another stepped twice; "
                  "inferred steps no longer wait for them (one step may have held two updates; wrap the "
                  "loop body in traceml.trace_step() for exact steps)")
            return True
        self._stepped.add(stepped)
        if not self._warned_optimizers:
            self._warned_optimizers = True
            _warn(f"{len(live)} optimizers exist: each inferred step ends once every one of them has "
                  "stepped (one update each, as in a GAN); if an iteration updates them differently, wrap "
                  "the loop body in traceml.trace_step() (warned once)")
        return self._stepped >= live

    def _hook_roots_only(self) -> None:
        """After the warm-up: time the outermost training modules found by their class's call (or,
        where that cannot be, a pre-hook each), then drop the global hooks.

        A root that takes no hooks (a scripted TorchScript module: ``torch.jit.script``) keeps the
        global hooks on instead, for the rest of the run: they still see its calls, and its own
        sub-modules run inside TorchScript, where no Python hook runs.
        """
        if not self._roots:
            return
        roots = [root for root in self._roots if root not in self._hooked]
        forward = self._session.forward
        handles: list[Any] = []
        try:
            for root in roots:
                handle = None
                # Its class's call, torch's fast path; not for a root Dynamo compiled (in place, or once a
                # compile wrapper was seen): changing its class's call after the compile would recompile it
                in_place = getattr(root, "_compiled_call_impl", None) is not None
                if forward is not None and not self._compiled and not in_place:
                    handle = forward.watch_root(root, self._root_start)
                if handle is None:
                    handle = root.register_forward_pre_hook(self._root_hook, prepend=True)
                handles.append(handle)
        except Exception:  # never a reason to stop training: the global hooks stay
            self._remove(handles)
            return
        self._hooked.update(roots)
        self._root_handles.extend(handles)
        self._remove(self._global_handles)
        if forward is not None:
            for root in self._roots:
                forward.watch(root, by_call=False)  # hooks where its class's call does not time it


class _RootForwardStart(CopySafeHook):
    """The forward pre-hook on a training root after the warm-up: a call may open a step.

    A :class:`CopySafeHook`: ``copy.deepcopy(root)`` (an EMA model, a teacher copy) gets a no-op
    hook, so the copy's forwards neither open steps nor count as the root's."""

    __slots__ = ("_inferred",)

    def __init__(self, inferred: InferredSteps) -> None:
        self._inferred = inferred

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        if is_compiling():  # traced by Dynamo (the root compiled in place): compile nothing of ours
            return
        self._inferred._outermost_call(module, known=True)


def _is_compiled_wrapper(module: torch.nn.Module) -> bool:
    """``module`` is ``torch.compile(module)``'s wrapper (Dynamo's ``OptimizedModule``).

    Read from ``sys.modules``: importing Dynamo takes seconds, and no wrapper exists before
    ``torch.compile`` has imported it. Runs for module calls during a warm-up only."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    return wrapper is not None and isinstance(module, wrapper)


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None
