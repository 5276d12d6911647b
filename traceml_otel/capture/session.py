"""The training session: one process's step telemetry behind one small, typed interface.

Everything else goes through :class:`Session`: the public API (``traceml.init``, ``trace_step``,
``outside_step``, the ``wrap_*`` helpers, ``shutdown``), the framework callbacks
(``integrations/_driver.py``), zero-code tracing (``integrations/auto_attach.py``) and the process
hooks (``capture/process_hooks.py``). :func:`current` is the process's session.

- :class:`Session` is what every call reaches before ``init()`` and after a failed or disabled one:
  each method does nothing.
- :class:`TrainingSession` holds the step recorder, the capture hooks, the hang watchdog, the time
  ledger and the link to this rank's emitter. It is built by the composition root
  (``traceml_otel/session_root.py``), which alone knows the emitter (capture never imports emit).

Training-thread cost: ``begin_step``/``end_step`` add one method call to the recorder's; the rest
runs once per model, optimizer or framework method.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from traceml_otel.capture.capture_config import CaptureConfig
from traceml_otel.capture.emitter_link import EmitterLink, Finishable
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.capture.step_state import NO_BLOCK as _NO_BLOCK
from traceml_otel.warn_line import warn

if TYPE_CHECKING:
    from traceml_otel.capture.inferred_steps import InferredSteps
    from traceml_otel.capture.model_discovery import ModelDiscovery
    from traceml_otel.capture.time_ledger import TimeLedger
    from traceml_otel.settings import Settings

_UNSEEN = object()
"""What :attr:`Session.block_model` holds while ``trace_step`` must take the session's full path."""


def _forward_not_timed(model: Any) -> None:
    """Say that torch refused our forward hooks on ``model`` (a TorchScript module; once per model)."""
    warn(f"the forward of {type(model).__name__} is not timed: torch takes no forward hooks on it (a "
         "scripted TorchScript module: torch.jit.script); its time counts in the step's residual. To time "
         "it, pass trace_step() a plain nn.Module whose forward calls it")


class Session:
    """The interface, and the session of a process where telemetry is off: every call is a no-op."""

    active = False
    block_model: Any = _NO_BLOCK
    """The model for which ``trace_step(model)`` may return :attr:`recorder` as its block (its usual
    call: this model, no declared work, no step inference running); a sentinel matching nothing until
    :meth:`begin_step` has opened a step for it."""
    config: CaptureConfig | None = None
    recorder: StepRecorder | None = None
    profiler_capture: Any = None
    """Deep captures (``capture/profiler_capture.py``): looked at only on :meth:`begin_step`'s full path."""
    time_ledger: TimeLedger | None = None

    def begin_step(self, model: Any, samples: int | None = None, tokens: int | None = None) -> bool:
        """Open a step; False when none was opened (telemetry off, a nested block, another thread)."""
        return False

    def end_step(self, exception_type: str | None) -> None:
        """Close the open step."""

    def flush(self) -> None:
        """Hand every completed step to the emitter now."""

    def shutdown(self, status: str = "ok") -> None:
        """Flush, stop the emitter (bounded) and undo every hook; ``status`` is how the program ends."""

    def count_internal_error(self) -> None:
        """An error of our own was caught on the training thread (warned once, counted at exit)."""

    def watch_model(self, model: Any) -> None:
        """Time ``model``'s outermost forward and find its parallelism (``wrap_forward``)."""

    def watch_optimizer(self, optimizer: Any) -> None:
        """Time ``optimizer.step()`` with per-optimizer hooks (``wrap_optimizer``)."""

    def timed_forward(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` timed as an outermost forward (a framework's training-step method)."""
        return call

    def timed_backward(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` timed as an outermost backward (a framework's backward method)."""
        return call

    def time_optimizer_class(self, cls: type) -> Callable[[], None] | None:
        """Time ``cls.step`` as the outermost optimizer call; returns an undo (``None``: nothing done)."""
        return None

    def model_seen(self, model: Any) -> None:
        """``model`` is the one traced now (a step's, or an outermost training forward inference saw)."""

    def catch_up_on_accelerate(self) -> None:
        """Install Accelerate's patches once ``accelerate`` is imported."""

    def start_inference(self) -> InferredSteps | None:
        """Infer the steps of a plain loop until an explicit step appears (zero-code tracing)."""
        return None

    def reconfigure(self, config: CaptureConfig) -> None:
        """Swap the hooks for ``config``'s, keeping the emitter (a script's ``init()`` after zero-code's)."""

    def forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): never write to the parent's emitter."""


class TrainingSession(Session):
    """Capture hooks, the step recorder and the link to this rank's emitter process."""

    active = True
    recorder: StepRecorder  # always one here (the base class's are None)
    time_ledger: TimeLedger

    def __init__(self, config: CaptureConfig, settings: Settings, link: EmitterLink,
                 manifest: Finishable | None = None) -> None:
        from traceml_otel.capture.device_clock import default_clock
        from traceml_otel.capture.session_services import (
            start_time_ledger,
            start_watchdog,
            watch_autocast,
        )

        self.settings = settings
        self.link = link
        self.manifest = manifest
        self.internal_errors = 0
        self.closed = False
        self.recorder = StepRecorder(
            link, default_clock(), flush_steps=settings.flush_steps,
            flush_interval_ns=settings.flush_interval_ns,
        )
        # end_step() is the recorder's own, bound once: it runs every step, and the method below would
        # add a Python frame only to pass the call on.
        self.end_step = self.recorder.end_step  # type: ignore[method-assign]
        self.recorder.on_refused = self._refused
        self.recorder.on_internal_error = self.count_internal_error
        self.wrapped_model: Any = None  # the model given to wrap_forward()
        self.inferred: InferredSteps | None = None
        """Step inference for a plain loop (zero-code tracing), until an explicit step replaces it."""
        self._install_capture(config)
        self.catch_up_on_accelerate()
        self.watchdog = start_watchdog(self.recorder, self.collectives, settings, warn)
        self.time_ledger = start_time_ledger(self.recorder, settings, warn)
        self.installed.append(watch_autocast(self.time_ledger))
        self.recorder.on_owner = self.time_ledger.training_thread  # the emitter samples that thread's CPU
        from traceml_otel.capture.capture_start import start_profiler_capture

        self.profiler_capture = start_profiler_capture(self, settings, warn)

    def _install_capture(self, config: CaptureConfig) -> None:
        """Build and install the hooks ``config`` asks for."""
        from traceml_otel.capture import accelerate_hooks, hooks
        from traceml_otel.capture.parallelism import WrapperRegistry

        self.config = config
        recorder = self.recorder
        self.forward = hooks.ForwardHooks(recorder) if config.forward else None
        self.optimizer_hooks = hooks.OptimizerHooks(recorder)
        from traceml_otel.capture.scaler_hooks import ScalerHooks

        self.scaler_hooks = ScalerHooks(recorder)
        self.backward = hooks.BackwardPatch(recorder)
        self.installed: list[Any] = []
        self.prefetch = accelerate_hooks.AcceleratePrefetchPatch(recorder) if config.h2d else None
        self.collectives = self._collective_timing(config)
        self.accelerate_calls = accelerate_hooks.AccelerateCallsPatch(
            self.optimizer_hooks if config.optimizer else None, self.backward if config.backward else None
        )
        self.wrappers = WrapperRegistry()
        self._model: Any = _UNSEEN
        self.discovery: ModelDiscovery | None = None
        """Finds the other models of explicit steps (``ModelDiscovery``), from the first explicit step."""
        self.block_model = _NO_BLOCK
        self._parallelism_by_model: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        for wanted, hook in (
            (True, self.wrappers),
            (config.backward, self.backward),
            (config.optimizer, self.optimizer_hooks),
            (config.optimizer, self.scaler_hooks),
            # Without a CUDA device no copy can be host-to-device: skip the Tensor.to patch.
            (config.h2d and recorder.clock.has_device, hooks.HostToDevicePatch(recorder)),
            (config.dataloader, hooks.DataLoaderPatch(recorder)),
        ):
            if wanted:
                hook.install()
                self.installed.append(hook)

    def _collective_timing(self, config: CaptureConfig) -> Any:
        """The collective hooks, installed; ``None`` when off or when they cannot be installed."""
        if not (config.collectives and self.settings.collectives):
            return None
        try:
            from traceml_otel.capture.collectives import CollectiveTiming

            timing = CollectiveTiming(self.recorder, warn)
            timing.install()
        except Exception as error:
            warn(f"collective timing is off for this run: {type(error).__name__}: {error}")
            return None
        self.installed.append(timing)
        return timing

    def reconfigure(self, config: CaptureConfig) -> None:
        """The script called ``init()`` with its own configuration after zero-code tracing started
        telemetry: swap the hooks, keep the emitter (no step was lost: inference stops first)."""
        from traceml_otel.capture.session_services import start_watchdog

        if self.inferred is not None:
            self.inferred.stop()
        for hook in reversed(self.installed):
            hook.uninstall()
        self._install_capture(config)
        self.catch_up_on_accelerate()
        if self.watchdog is not None:  # it watches the new collective hooks' progress
            self.watchdog.stop(clean=True)
        self.watchdog = start_watchdog(self.recorder, self.collectives, self.settings, warn)

    # --- steps -------------------------------------------------------------------
    def begin_step(self, model: Any, samples: int | None = None, tokens: int | None = None) -> bool:
        capture = self.profiler_capture
        if capture is not None and capture.pending is not None:  # armed: the profiler starts before the step
            capture.before_step()
        if self.inferred is not None:  # an explicit step (trace_step or a framework callback) takes over
            self.inferred.stop()
        if model is not self._model:
            self.model_seen(model)
            self._discover_models(model)
        recorder = self.recorder
        other_threads = recorder.other_thread_steps
        if recorder.begin_step(samples, tokens):
            # trace_step(model) may now use the recorder (not while a deep capture is armed or running)
            if self.inferred is None and not self.closed and (capture is None or not capture.busy):
                self.block_model = model
            return True
        self._refused("thread" if recorder.other_thread_steps != other_threads else "nested")
        return False

    def _discover_models(self, model: Any) -> None:
        """Explicit steps: find the other models the next steps run (a GAN's discriminator, a teacher)
        and time their forwards too (``capture/model_discovery.py``)."""
        if self.forward is None or self.closed:
            return
        if self.discovery is None:
            from traceml_otel.capture.model_discovery import ModelDiscovery

            self.discovery = ModelDiscovery(self.recorder, self.forward)
            self.installed.append(self.discovery)
        self.discovery.start(model)

    def _refused(self, why: str) -> None:
        """A block opened no step: on another thread than the training thread, or inside an open step.
        Warned the first time of each (the recorder counts them all)."""
        recorder = self.recorder
        if why == "thread" and recorder.other_thread_steps == 1:
            warn(f"trace_step() was called on a second thread ({threading.current_thread().name}); "
                 "telemetry traces one training thread per process (the first to call it), so this "
                 "thread's steps and phases are ignored, never merged (counted at exit; warned once)")
        elif why == "nested" and recorder.nested_steps == 1:
            warn("trace_step() blocks are nested; only the outermost block is a step (the inner ones are "
                 "not counted; warned once)")

    def end_step(self, exception_type: str | None) -> None:
        """Close the open step (``__init__`` binds the recorder's ``end_step`` over this method)."""
        self.recorder.end_step(exception_type)

    def model_seen(self, model: Any) -> None:
        """The traced model changed: hook it, find its parallelism (once per model, so loops that
        alternate models do not walk module trees every step), catch up on a late ``accelerate``."""
        self._model = model
        self.block_model = _NO_BLOCK  # until a step opens for this model through begin_step
        if self.time_ledger is not None and model is not None:
            self.time_ledger.model_seen(model)  # already half precision? (the first few models)
        if model is not None and self.forward is not None:
            # (step inference times a root that refuses hooks with its global module hooks: no warning)
            if self.inferred is None:
                self.forward.watch(model, _forward_not_timed)
            else:  # hooks during step inference's warm-up; its roots move to their class's call after it
                self.forward.watch(model, None, by_call=False)
        if model is not None and self.collectives is not None:
            self.collectives.watch(model)
        try:
            known = self._parallelism_by_model.get(model)
        except TypeError:  # None or not weak-referenceable
            known = None
        if known is None:
            from traceml_otel.capture.parallelism import detect_parallelism

            known = detect_parallelism(
                model if model is not None else self.wrapped_model, self.settings.identity.world_size,
                self.wrappers,
            )
            try:
                self._parallelism_by_model[model] = known
            except TypeError:
                pass
        self.recorder.parallelism = known
        self.catch_up_on_accelerate()

    def catch_up_on_accelerate(self) -> None:
        for patch in (self.prefetch, self.accelerate_calls):
            if patch is not None and not patch.installed:
                patch.install()
                if patch.installed:
                    self.installed.append(patch)

    def start_inference(self) -> InferredSteps | None:
        recorder = self.recorder
        if recorder.step or recorder.in_step or self.inferred is not None:
            return None
        from traceml_otel.capture.inferred_steps import InferredSteps

        inferred = InferredSteps(self)
        inferred.start()
        if not inferred.active:
            return None
        self.inferred = inferred
        self.block_model = _NO_BLOCK  # explicit steps go through begin_step, which stops the inference
        return inferred

    # --- what the wrap_* helpers and the framework callbacks time ------------------------
    def watch_model(self, model: Any) -> None:
        from traceml_otel.capture.hooks import ForwardHooks
        from traceml_otel.capture.parallelism import detect_parallelism

        if self.forward is None:
            self.forward = ForwardHooks(self.recorder)
        self.forward.watch(model, _forward_not_timed)
        self.wrapped_model = model
        world_size = self.settings.identity.world_size
        self.recorder.parallelism = detect_parallelism(model, world_size, self.wrappers)
        if self.collectives is not None:
            self.collectives.watch(model)

    def watch_optimizer(self, optimizer: Any) -> None:
        from traceml_otel.capture.wrappers import watch_optimizer

        watch_optimizer(optimizer, self.optimizer_hooks.pre, self.optimizer_hooks.post)

    def timed_forward(self, call: Callable[..., Any]) -> Callable[..., Any]:
        from traceml_otel.capture.hooks import ForwardHooks

        if self.forward is None:
            self.forward = ForwardHooks(self.recorder)
        return self.forward.timed(call)

    def timed_backward(self, call: Callable[..., Any]) -> Callable[..., Any]:
        return self.backward.timed(call)

    def time_optimizer_class(self, cls: type) -> Callable[[], None] | None:
        if hasattr(cls.__dict__.get("step"), "__traceml_original__"):
            return None
        return self.optimizer_hooks.wrap_outer_step(cls)

    # --- the end -------------------------------------------------------------------
    def flush(self) -> None:
        self.recorder.flush()

    def count_internal_error(self) -> None:
        if self.internal_errors == 0:
            warn("an internal instrumentation error was ignored (training continues)")
        self.internal_errors += 1

    def shutdown(self, status: str = "ok") -> None:
        if self.closed:
            return
        self.closed = True
        self.block_model = _NO_BLOCK
        from traceml_otel.capture.session_end import close_session

        close_session(self, status)

    def forget_in_child(self) -> None:
        self.closed = True
        self.block_model = _NO_BLOCK
        self.link.detach()
        if self.watchdog is not None:  # its thread did not survive the fork; its parent may ask
            self.watchdog = None  # for this child's stacks (a DataLoader worker) on a hang
            from traceml_otel.capture.worker_stacks import arm_in_child

            arm_in_child()


NOOP = Session()
_current: Session = NOOP
"""The process's session. ``traceml_otel._api`` reads it directly on every step (a call of
:func:`current` is a Python frame); :func:`install` and :func:`take` are its only writers."""


def current() -> Session:
    """The process's session (:data:`NOOP` before ``init()``, after ``shutdown()``, when off)."""
    return _current


def install(session: Session) -> None:
    """Make ``session`` the process's session."""
    global _current
    _current = session


def take() -> Session:
    """Detach the process's session for its caller to end; every call reaches :data:`NOOP` from now on."""
    global _current
    session, _current = _current, NOOP
    return session
