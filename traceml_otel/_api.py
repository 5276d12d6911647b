"""The public API: ``init``, ``trace_step``, ``outside_step``, the ``wrap_*`` helpers, ``flush`` and
``shutdown``.

``init()`` fails open: when telemetry cannot start it warns once on stderr and every
call below becomes a no-op (``strict=True`` or ``TRACEML_STRICT=1`` raises instead).
User exceptions inside ``trace_step`` always propagate; errors of our own are counted,
reported once, and never reach the training loop.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from types import TracebackType
from typing import Any

from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.sanitize import strip_control
from traceml_otel.settings import Settings, linger_budget_s, load_settings, strict_requested
from traceml_otel.wire.control import LocalReport
from traceml_otel.wire.hello import Hello

MODES = ("auto", "manual", "selective")
_UNSEEN = object()


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """Which automatic hooks are installed."""

    mode: str
    dataloader: bool
    forward: bool
    backward: bool
    optimizer: bool
    h2d: bool
    collectives: bool = False
    """Time collectives: DDP's gradient all-reduce and ``torch.distributed`` calls inside a step."""


def _warn(message: str) -> None:
    print(f"traceml: {message}", file=sys.stderr, flush=True)


def capture_config(
    mode: str, patches: dict[str, bool | None], collectives: bool | None = None
) -> CaptureConfig:
    """Validate ``init()``'s mode and ``patch_*`` arguments.

    Collective timing is on in ``auto`` mode and off otherwise, unless ``collectives`` says.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    given = {name: value for name, value in patches.items() if value is not None}
    if mode != "selective":
        if given:
            raise ValueError(
                f"patch_* arguments need mode='selective' (got mode={mode!r} with {sorted(given)})"
            )
        on = mode == "auto"
        return CaptureConfig(mode, *([on] * 5), collectives=on if collectives is None else collectives)
    if not any(given.values()):
        raise ValueError("mode='selective' needs at least one patch_*=True")
    return CaptureConfig(mode, *(bool(patches.get(name)) for name in
                                 ("dataloader", "forward", "backward", "optimizer", "h2d")),
                         collectives=bool(collectives))


class _NoopTelemetry:
    """What every call reaches before ``init()`` and after a failed or disabled one."""

    active = False
    config: CaptureConfig | None = None
    recorder: StepRecorder | None = None
    time_ledger: Any = None

    def begin_step(self, model: Any, samples: int | None = None, tokens: int | None = None) -> bool:
        return False

    def end_step(self, exception_type: str | None) -> None:
        pass

    def flush(self) -> None:
        pass

    def shutdown(self, status: str = "ok") -> None:
        pass


class _Telemetry(_NoopTelemetry):
    """Capture hooks plus the channel to this rank's emitter process."""

    active = True

    def __init__(self, config: CaptureConfig, settings: Settings) -> None:
        from traceml_otel.capture.device_clock import default_clock
        from traceml_otel.emit.channel import EmitterChannel

        self.config = config
        self.settings = settings
        self.internal_errors = 0
        self._closed = False
        self.channel = EmitterChannel(_hello(settings))
        self.recorder = StepRecorder(
            self.channel, default_clock(),
            flush_steps=settings.flush_steps, flush_interval_ns=settings.flush_interval_ns,
        )
        self.wrapped_model: Any = None  # the model given to wrap_forward()
        self.inferred: Any = None
        """Step inference for a plain loop (zero-code tracing), until an explicit step replaces it."""
        self._install_capture(config)
        self.manifest = _start_direct_manifest(settings)
        self._catch_up_on_accelerate()
        self.watchdog = _start_watchdog(self.recorder, self.collectives, settings)
        self.time_ledger = _start_time_ledger(self.recorder, settings)

    def _install_capture(self, config: CaptureConfig) -> None:
        """Build and install the hooks ``config`` asks for."""
        from traceml_otel.capture import hooks
        from traceml_otel.capture.parallelism import WrapperRegistry

        self.config = config
        self.forward = hooks.ForwardHooks(self.recorder) if config.forward else None
        self.optimizer_hooks = hooks.OptimizerHooks(self.recorder)
        self.backward = hooks.BackwardPatch(self.recorder)
        self._installed: list[Any] = []
        self.prefetch = hooks.AcceleratePrefetchPatch(self.recorder) if config.h2d else None
        self.collectives = self._collective_timing(config, self.settings)
        self.accelerate_calls = hooks.AccelerateCallsPatch(
            self.optimizer_hooks if config.optimizer else None, self.backward if config.backward else None
        )
        self.wrappers = WrapperRegistry()
        self._model: Any = _UNSEEN
        self._parallelism_by_model: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        for wanted, hook in (
            (True, self.wrappers),
            (config.backward, self.backward),
            (config.optimizer, self.optimizer_hooks),
            # Without a CUDA device no copy can be host-to-device: skip the Tensor.to patch.
            (config.h2d and self.recorder.clock.has_device, hooks.HostToDevicePatch(self.recorder)),
            (config.dataloader, hooks.DataLoaderPatch(self.recorder)),
        ):
            if wanted:
                hook.install()
                self._installed.append(hook)

    def reconfigure(self, config: CaptureConfig) -> None:
        """The script called ``init()`` with its own configuration after zero-code tracing started
        telemetry: swap the hooks, keep the emitter (no step was lost: inference stops first)."""
        if self.inferred is not None:
            self.inferred.stop()
        for hook in reversed(self._installed):
            hook.uninstall()
        self._install_capture(config)
        self._catch_up_on_accelerate()
        if self.watchdog is not None:  # it watches the new collective hooks' progress
            self.watchdog.stop(clean=True)
        self.watchdog = _start_watchdog(self.recorder, self.collectives, self.settings)

    def _collective_timing(self, config: CaptureConfig, settings: Settings) -> Any:
        """The collective hooks, installed; ``None`` when off or when they cannot be installed."""
        if not (config.collectives and settings.collectives):
            return None
        try:
            from traceml_otel.capture.collectives import CollectiveTiming

            timing = CollectiveTiming(self.recorder, _warn)
            timing.install()
        except Exception as error:
            _warn(f"collective timing is off for this run: {type(error).__name__}: {error}")
            return None
        self._installed.append(timing)
        return timing

    def begin_step(self, model: Any, samples: int | None = None, tokens: int | None = None) -> bool:
        if self.inferred is not None:  # an explicit step (trace_step or a framework callback) takes over
            self.inferred.stop()
        if model is not self._model:
            self._first_step_with(model)
        recorder = self.recorder
        other_threads = recorder.other_thread_steps
        if recorder.begin_step(samples, tokens):
            return True
        if recorder.other_thread_steps != other_threads:
            if other_threads == 0:
                _warn(f"trace_step() was called on a second thread ({threading.current_thread().name}); "
                      "telemetry traces one training thread per process (the first to call it), so this "
                      "thread's steps and phases are ignored, never merged (counted at exit; warned once)")
            return False
        if recorder.nested_steps == 1:
            _warn("trace_step() blocks are nested; only the outermost block is a step (the inner ones are "
                  "not counted; warned once)")
        return False

    def _first_step_with(self, model: Any) -> None:
        """When the traced model changes: hook it, find its parallelism (once per model, so loops
        that alternate models do not walk module trees every step), catch up on a late ``accelerate``."""
        self._model = model
        if model is not None and self.forward is not None:
            self.forward.watch(model)
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
        self._catch_up_on_accelerate()

    def _catch_up_on_accelerate(self) -> None:
        """Accelerate's patches install once it is imported (at init, or later at a first step)."""
        for patch in (self.prefetch, self.accelerate_calls):
            if patch is not None and not patch.installed:
                patch.install()
                if patch.installed:
                    self._installed.append(patch)

    def end_step(self, exception_type: str | None) -> None:
        self.recorder.end_step(exception_type)

    def flush(self) -> None:
        self.recorder.flush()

    def shutdown(self, status: str = "ok") -> None:
        if self._closed:
            return
        self._closed = True
        if self.watchdog is not None:
            self.watchdog.stop(clean=status == "ok")
        try:
            if self.inferred is not None:  # an inferred step still open at exit is no completed update
                self.inferred.stop()
            if self.recorder.in_step:
                self.recorder.end_step("Interrupted")
            self.recorder.flush(wait_s=2.0)
            lost = self.recorder.unresolved_steps
            self.channel.dropped_steps += lost
            self.time_ledger.write()  # the emitter's live time counters read the last blocks at its end
            # The scrape endpoint stays up after the end until every scraper saw the end marker.
            finished = self.channel.close(
                self.settings.shutdown_timeout_s + linger_budget_s(self.settings.prometheus_linger_s), status,
                traced=self.recorder.step, stall_s=self.settings.emitter_stall_s,
            )
            if self.channel.local_report is None:
                self._record_handoff(status)
            self.time_ledger.write(ended=True)
            if self.manifest is not None:
                self.manifest.finish(status)
        except Exception as error:
            _warn(f"telemetry shutdown failed: {type(error).__name__}: {error}")
            return
        for hook in reversed(self._installed):  # last installed first: patches of one attribute nest
            hook.uninstall()
        if self.channel.dropped_steps:
            reason = self.channel.broken or "backlog full or device work unfinished"
            _warn(f"{self.channel.dropped_steps} step(s) could not be handed to the emitter and are "
                  f"missing from telemetry ({reason})")
        if self.internal_errors:
            _warn(f"{self.internal_errors} internal instrumentation error(s) were ignored")
        if self.recorder.other_thread_steps:
            _warn(f"{self.recorder.other_thread_steps} trace_step() block(s) and "
                  f"{self.recorder.other_thread_phases} phase call(s) on threads other than the training "
                  "thread were ignored (one training thread per process)")
        handed = self.channel.steps_offered - self.channel.dropped_steps
        local = local_copy_sentence(self.channel.local_report, self.recorder.step, self.settings.run_dir,
                                    handed, self.channel.emitter_fate())
        if local:
            _warn(local)
        if not finished and self.channel.local_report is not None:
            _warn("the emitter was still exporting over OTLP at the shutdown deadline; it finishes in the "
                  "background")


    def _record_handoff(self, status: str) -> None:
        """The emitter did not report back: write what was handed to it, for the account and diagnosis."""
        run_dir = self.settings.run_dir
        if run_dir is None:
            return
        from traceml_otel.wire.handoff import Handoff, write_handoff

        channel = self.channel
        handoff = Handoff(
            run_id=self.settings.run_id, rank=self.settings.identity.rank, steps_traced=self.recorder.step,
            steps_handed=channel.steps_handed, steps_dropped=channel.dropped_steps,
            emitter=channel.emitter_fate(), end_status=status,
        )
        try:
            write_handoff(Path(run_dir), handoff)
        except OSError as error:
            _warn(f"cannot record the handoff in {run_dir}: {error.strerror or error}")


def local_copy_sentence(
    report: LocalReport | None, traced: int, run_dir: Any, handed: int | None = None,
    fate: str = "exited",
) -> str | None:
    """What the trainer says about the local copy at exit, from the emitter's own count only."""
    if run_dir is None:
        return None
    if report is None:
        handed_text = "" if handed is None else f"; {handed} of them were handed to it"
        return (f"the telemetry process {fate} before reporting on the local copy, so it may be missing any "
                f"of the {traced} traced steps{handed_text} (the account and rank-R.export.json say how many "
                "it wrote)")
    if not report.enabled:
        return f"the local copy was turned off ({report.disabled}); it holds {report.steps} of {traced} steps"
    if report.steps != traced:
        return f"the local copy holds {report.steps} of {traced} steps"
    return None


def _start_direct_manifest(settings: Settings) -> Any:
    """Rank 0 of a run ``traceml run`` did not launch writes ``manifest.json`` (never fatal)."""
    if settings.run_dir is None or settings.identity.rank != 0 or settings.launcher == "traceml run":
        return None
    from traceml_otel.launch.direct import DirectManifest

    try:
        return DirectManifest.start(
            settings.run_dir, run_id=settings.run_id, run_name=settings.run_name,
            world_size=settings.identity.world_size, launcher=settings.launcher,
        )
    except OSError as error:
        _warn(f"could not write the run manifest in {settings.run_dir}: {error}")
        return None


def _start_time_ledger(recorder: StepRecorder, settings: Settings) -> Any:
    """This rank's time record (``rank-R.time.json``), written now with the process start."""
    from traceml_otel.capture.time_ledger import TimeLedger

    ledger = TimeLedger(
        settings.run_dir, settings.identity.rank, settings.run_id, lambda: recorder.step,
        peak_flops=settings.peak_flops, dtype=settings.mfu_dtype, warn=_warn,
    )
    if settings.launcher in ("torchrun", "accelerate launch"):  # start-up counts from the agent's start
        from traceml_otel.capture.time_ledger import process_start_time

        ledger.launcher_start = process_start_time(os.getppid())
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    ledger.restart = int(restart) if restart.isdigit() else 0
    if ledger.restart > 0:
        ledger.carry_earlier_attempt()
        recorder.step = ledger.first_step  # go on numbering: the earlier attempts' spans keep their ids
    ledger.write()
    return ledger


def _start_watchdog(recorder: StepRecorder, collectives: Any, settings: Settings) -> Any:
    """This rank's hang watchdog (:mod:`traceml_otel.capture.watchdog`); ``None`` when turned off."""
    if settings.hang_timeout_s <= 0:
        return None
    from traceml_otel.capture.watchdog import HangWatchdog

    identity = settings.identity
    try:
        watchdog = HangWatchdog(
            recorder, getattr(collectives, "progress", None), rank=identity.rank,
            world_size=identity.world_size, run_id=settings.run_id, host=identity.host,
            run_dir=settings.run_dir, floor_s=settings.hang_timeout_s, factor=settings.hang_factor,
            announce=settings.launcher != "traceml run", warn=_warn,
        )
        watchdog.start()
    except Exception as error:  # never a reason not to train
        _warn(f"the hang watchdog is off for this run: {type(error).__name__}: {error}")
        return None
    return watchdog


def user_resource_attributes() -> dict[str, Any]:
    """The resource of a TracerProvider the program already set up, if any.

    We never replace a global provider. Our spans are built in the emitter process (building
    them here would put 60-80 us per span back on the training thread), so the user's span
    processors do not see them; instead they carry the user's resource, so they land under the
    same service and attributes as the program's own telemetry.
    """
    trace_module = sys.modules.get("opentelemetry.trace")
    if trace_module is None:
        return {}
    resource = getattr(trace_module.get_tracer_provider(), "resource", None)
    attributes = getattr(resource, "attributes", None) or {}
    return {key: value for key, value in attributes.items() if isinstance(value, (str, bool, int, float))}


def _hello(settings: Settings) -> Hello:
    """What this rank's emitter needs to know, for the first frame on its pipe."""
    identity = settings.identity
    return Hello(
        run_id=settings.run_id, rank=identity.rank, local_rank=identity.local_rank,
        world_size=identity.world_size, node_rank=identity.node_rank, host=identity.host, pid=os.getpid(),
        anchor_ns=time.time_ns() - perf_counter_ns(), shutdown_timeout_s=settings.shutdown_timeout_s,
        service_name=settings.service_name, run_dir=str(settings.run_dir) if settings.run_dir else None,
        traces_endpoint=settings.traces.endpoint if settings.traces else None,
        traces_protocol=settings.traces.protocol if settings.traces else None,
        metrics_endpoint=settings.metrics.endpoint if settings.metrics else None,
        metrics_protocol=settings.metrics.protocol if settings.metrics else None,
        sampler=settings.sampler, sampler_arg=settings.sampler_arg,
        prometheus_port=settings.prometheus_port, prometheus_addr=settings.prometheus_addr,
        prometheus_linger_s=settings.prometheus_linger_s, cpus=_usable_cpus(),
        user_resource=user_resource_attributes(), job=settings.job,
    )


def _usable_cpus() -> int | None:
    """CPUs this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


_NOOP = _NoopTelemetry()
_telemetry: _NoopTelemetry = _NOOP
_lock = threading.Lock()
_init_config: tuple[CaptureConfig, bool] | None = None
_warned_not_initialised = False
_warned_outside_in_step = False
_auto_started = False
"""True when zero-code tracing called ``init()`` (a later ``init()`` of the script's then reconfigures)."""
_exit_status = "ok"
"""How the program is ending, for the emitter's ``end_status``: an uncaught exception or Ctrl-C."""


def init(
    mode: str = "auto",
    *,
    patch_dataloader: bool | None = None,
    patch_forward: bool | None = None,
    patch_backward: bool | None = None,
    patch_optimizer: bool | None = None,
    patch_h2d: bool | None = None,
    disabled: bool = False,
    strict: bool | None = None,
    collectives: bool | None = None,
) -> bool:
    """Start step telemetry for this process. Returns True when telemetry is active.

    Args:
        mode: ``auto`` installs every hook; ``manual`` none (use the ``wrap_*`` helpers);
            ``selective`` only the ``patch_*=True`` ones.
        disabled: do nothing (as does ``TRACEML_DISABLED=1`` or ``OTEL_SDK_DISABLED=true``).
        strict: raise instead of warning when telemetry cannot start.
        collectives: time collectives (DDP's gradient all-reduce, ``torch.distributed`` calls inside
            a step); default on in ``auto`` mode, off otherwise. ``TRACEML_COLLECTIVES=0`` turns it off.

    Calling it again with the same arguments is a no-op; with different ones, an error.
    """
    global _telemetry, _init_config
    config = capture_config(mode, {
        "dataloader": patch_dataloader, "forward": patch_forward, "backward": patch_backward,
        "optimizer": patch_optimizer, "h2d": patch_h2d,
    }, collectives)
    with _lock:
        if _init_config is not None:
            if _auto_started and _init_config != (config, disabled):
                if disabled:
                    _warn("init(disabled=True) comes after zero-code tracing started telemetry; turn it "
                          "off with traceml run --no-auto-attach or TRACEML_AUTO_ATTACH=0")
                    return _telemetry.active
                _init_config = (config, disabled)
                if isinstance(_telemetry, _Telemetry):
                    _telemetry.reconfigure(config)
                return _telemetry.active
            if _init_config != (config, disabled):
                raise RuntimeError("traceml.init() was already called with a different configuration: "
                                   + _config_difference(_init_config, (config, disabled)))
            return _telemetry.active
        _init_config = (config, disabled)
        try:
            settings = load_settings()
        except ValueError as error:
            if strict or (strict is None and strict_requested()):
                raise
            _warn(f"telemetry disabled: {error}")
            return False
        if disabled or settings.sdk_disabled:
            return False
        try:
            _telemetry = _Telemetry(config, settings)
        except Exception as error:
            if strict or (strict is None and settings.strict):
                raise
            _warn(f"telemetry could not start and is off for this run:"
                  f" {type(error).__name__}: {error}")
            return False
        atexit.register(shutdown)
        os.register_at_fork(after_in_child=_forget_in_child)
        _install_sigterm_flush()
        _install_exit_status_hook()
        _stop_with_launcher()
        return True


def init_automatically() -> bool:
    """``init()`` on behalf of zero-code tracing: a later ``init(...)`` of the script's own may still
    choose another configuration (the hooks are swapped, not refused)."""
    global _auto_started
    if _init_config is not None:
        return _telemetry.active
    active = init()
    _auto_started = True
    return active


def _config_difference(before: tuple[CaptureConfig, bool], now: tuple[CaptureConfig, bool]) -> str:
    """``mode: 'auto' then 'manual'; disabled: False then True`` for the fields that differ."""
    fields = tuple(field.name for field in dataclasses.fields(CaptureConfig))  # every field, none forgotten
    names = {name: name if name in ("mode", "collectives") else f"patch_{name}" for name in fields}
    parts = [
        f"{names[name]}: {getattr(before[0], name)!r} then {getattr(now[0], name)!r}"
        for name in fields
        if getattr(before[0], name) != getattr(now[0], name)
    ]
    if before[1] != now[1]:
        parts.append(f"disabled: {before[1]!r} then {now[1]!r}")
    return "; ".join(parts) or "the same settings spelled differently"


class _StepContext:
    __slots__ = ("_counter", "_flops", "_measure", "_model", "_opened", "_samples", "_tokens")

    def __init__(
        self, model: Any, samples: int | None, tokens: int | None, flops: float | None = None,
        measure_flops: bool = False,
    ) -> None:
        self._model = model
        self._samples = samples
        self._tokens = tokens
        self._flops = flops
        self._measure = measure_flops
        self._counter: Any = None
        self._opened = False

    def __enter__(self) -> None:
        telemetry = _telemetry
        try:
            self._opened = telemetry.begin_step(self._model, self._samples, self._tokens)
            if self._opened and self._measure and telemetry.time_ledger is not None:
                from traceml_otel.capture.flops import StepFlopCounter

                counter = StepFlopCounter()
                self._counter = counter if counter.start() else None
        except Exception:
            _count_internal_error(telemetry)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if not self._opened:  # a nested block, or telemetry off
            return False
        self._opened = False
        telemetry = _telemetry
        try:
            counted = self._counter.stop() if self._counter is not None else None
            self._counter = None
            telemetry.end_step(exc_type.__name__ if exc_type is not None else None)
            ledger = telemetry.time_ledger
            if ledger is not None and self._flops is not None:
                ledger.declare_step_flops(self._flops)
            if ledger is not None and counted is not None:
                from traceml_otel.capture.flops import device_name

                ledger.measured_flops(counted, telemetry.recorder.step - 1, device_name())
        except Exception:
            _count_internal_error(telemetry)
        return False


def _work(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        try:
            value = int(value)  # e.g. a 0-d tensor or numpy integer
        except (TypeError, ValueError):
            raise TypeError(f"trace_step({name}=) takes a non-negative int, not {value!r}") from None
        if value < 0:
            raise ValueError(f"trace_step({name}=) takes a non-negative int, not {value}")
    return value


def trace_step(
    model: Any = None, *, samples: int | None = None, tokens: int | None = None, flops: float | None = None,
    measure_flops: bool = False,
) -> _StepContext:
    """Context manager around one training step (zero_grad → forward → backward → step).

    Pass the model (or its DDP/FSDP wrapper) so its outermost forward is timed. ``samples`` and
    ``tokens`` declare the step's work (per rank); without ``samples``, the batch dimension of what
    the DataLoader returned is used. Blocks do not nest: an inner block is not counted.
    ``flops``: the model FLOPs of this whole step on this rank (every micro-batch of it), for MFU.
    ``measure_flops=True``: count them with ``FlopCounterMode`` in this one step (use it once; the
    count is then used for every step). See ``docs/goodput.md``.
    """
    if _telemetry is _NOOP:
        _warn_not_initialised()
    measure = measure_flops is not False and bool(measure_flops)
    return _StepContext(model, _work("samples", samples), _work("tokens", tokens),
                        None if flops is None else _flops(flops), measure)


def _flops(value: float | None) -> float | None:
    """A declared FLOPs count, or ``None`` (with one warning) when it is not a finite number >= 0."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number != number or number < 0 or number == float("inf"):
        _warn(f"flops={strip_control(repr(value))[:40]} is not a finite number of FLOPs >= 0; ignored")
        return None
    return number


def declare_flops(*, per_sample: float | None = None, per_token: float | None = None) -> None:
    """Declare the model FLOPs of one training sample or token (forward and backward), for MFU.

    The analyzer multiplies it by each step's samples or tokens (``trace_step(samples=, tokens=)``
    or the loader's batch size). Call it after ``init()``; see ``docs/goodput.md``.
    """
    ledger = _telemetry.time_ledger
    if ledger is None:
        if _init_config is None:
            _warn("declare_flops() called before traceml.init(); ignored")
        return
    ledger.per_sample = _flops(per_sample)
    ledger.per_token = _flops(per_token)
    ledger.write()


def resume_from(step: int) -> None:
    """Say that this attempt resumed from a checkpoint taken after ``step`` completed steps.

    After a restart (torchrun's ``--max-restarts``, ``traceml run --max-restarts``), the steps from
    ``step`` up to where the earlier attempt got are done again: they count as time lost to the
    restart (``redone_steps``), not as goodput. Call it after ``init()``, once the checkpoint is
    loaded; see ``docs/goodput.md``.
    """
    ledger = _telemetry.time_ledger
    if ledger is None:
        if _init_config is None:
            _warn("resume_from() called before traceml.init(); ignored")
        return
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        try:
            number = int(step)  # e.g. a 0-d tensor or numpy integer
        except (TypeError, ValueError):
            number = -1
        if number < 0 or isinstance(step, bool):
            shown = strip_control(repr(step))[:40]
            raise ValueError(f"resume_from() takes a non-negative step count, not {shown}")
        step = number
    ledger.resume_from(step)


class _OutsideStep(contextlib.ContextDecorator):
    __slots__ = ("_entered", "_kind")

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._entered: list[StepRecorder | None] = []  # one per open use (re-entrant as a decorator)

    def __enter__(self) -> None:
        recorder = _telemetry.recorder
        self._entered.append(recorder)
        if recorder is None:
            return
        if recorder.in_step:
            _warn_outside_in_step(self._kind)
        recorder.enter_outside(self._kind)
        if _telemetry.time_ledger is not None:
            _telemetry.time_ledger.enter_outside()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        recorder = self._entered.pop() if self._entered else None
        if recorder is not None:
            recorder.exit_outside()
            ledger = _telemetry.time_ledger
            if ledger is not None:
                try:
                    ledger.exit_outside(self._kind, recorder.in_step)
                except Exception:
                    _count_internal_error(_telemetry)
        return False


def outside_step(kind: str) -> _OutsideStep:
    """Context manager (or decorator) around work between training steps: evaluation, a checkpoint.

    Batches fetched inside it are not counted as the next step's input wait (without it, an
    evaluation loop's fetches are). Use it between ``trace_step`` blocks, never inside one: a step
    span covers all its block's time. ``kind`` names the work (``"evaluation"``, ``"checkpoint"``).
    The framework callbacks use it for their evaluation and checkpoints.

        with traceml.outside_step("evaluation"):
            evaluate(model, val_loader)
    """
    if not isinstance(kind, str) or not kind.strip():
        raise TypeError(f"outside_step() takes a non-empty name such as 'evaluation', not {kind!r}")
    return _OutsideStep(kind)


def _warn_outside_in_step(kind: str) -> None:
    global _warned_outside_in_step
    if not _warned_outside_in_step:
        _warned_outside_in_step = True
        _warn(f"outside_step({strip_control(kind)[:40]!r}) was entered inside a trace_step() block, so that "
              "step's span covers it; call it between steps (warned once)")


def flush() -> None:
    """Hand every completed step to the emitter now."""
    try:
        _telemetry.flush()
    except Exception:
        _count_internal_error(_telemetry)


def shutdown() -> None:
    """Flush and stop telemetry; waits for the local copy and (bounded) for OTLP export."""
    global _telemetry
    telemetry, _telemetry = _telemetry, _NOOP
    telemetry.shutdown(status=_exit_status)


def _recorder_for(helper: str, auto_flag: str) -> StepRecorder | None:
    telemetry = _telemetry
    if telemetry.recorder is None:
        _warn_not_initialised()
        return None
    if getattr(telemetry.config, auto_flag):
        raise ValueError(f"{helper}() would double count: the automatic {auto_flag} hook is active")
    return telemetry.recorder


def wrap_dataloader_fetch(loader: Iterable[Any]) -> Iterable[Any]:
    """Time each ``next()`` on ``loader`` as input wait: any iterable, iterator or generator (a
    streaming reader, slices of tensors in memory), or a DataLoader when its automatic hook is off."""
    from traceml_otel.capture.wrappers import TimedFetchIterator

    if not _is_torch_loader(loader):  # the automatic hook times DataLoader iterators only
        telemetry = _telemetry
        if telemetry.recorder is None:
            _warn_not_initialised()
            return loader
        return TimedFetchIterator(loader, telemetry.recorder)
    recorder = _recorder_for("wrap_dataloader_fetch", "dataloader")
    return loader if recorder is None else TimedFetchIterator(loader, recorder)


def _is_torch_loader(loader: Any) -> bool:
    """A torch ``DataLoader`` or one of its iterators (what the automatic fetch hook already times)."""
    module = sys.modules.get("torch.utils.data.dataloader")
    if module is None:
        return False
    return isinstance(loader, (module.DataLoader, module._BaseDataLoaderIter))


def wrap_forward(model: Any) -> Any:
    """Time the outermost forward of ``model``; returns the same model."""
    from traceml_otel.capture.hooks import ForwardHooks
    from traceml_otel.capture.parallelism import detect_parallelism

    recorder = _recorder_for("wrap_forward", "forward")
    if recorder is not None:
        telemetry = _telemetry
        if getattr(telemetry, "forward", None) is None:
            telemetry.forward = ForwardHooks(recorder)  # type: ignore[attr-defined]
        telemetry.forward.watch(model)  # type: ignore[attr-defined]
        telemetry.wrapped_model = model  # type: ignore[attr-defined]
        recorder.parallelism = detect_parallelism(
            model, telemetry.settings.identity.world_size, telemetry.wrappers  # type: ignore[attr-defined]
        )
        if getattr(telemetry, "collectives", None) is not None:
            telemetry.collectives.watch(model)  # type: ignore[attr-defined]
    return model


def wrap_backward(loss: Any) -> Any:
    """Return ``loss`` with a timed ``.backward()``."""
    from traceml_otel.capture.wrappers import TimedLoss

    recorder = _recorder_for("wrap_backward", "backward")
    return loss if recorder is None else TimedLoss(loss, recorder)


def wrap_optimizer(optimizer: Any) -> Any:
    """Time ``optimizer.step()``; returns the same object (GradScaler-safe)."""
    from traceml_otel.capture.wrappers import watch_optimizer

    recorder = _recorder_for("wrap_optimizer", "optimizer")
    if recorder is not None:
        hooks = _telemetry.optimizer_hooks  # type: ignore[attr-defined]
        watch_optimizer(optimizer, hooks.pre, hooks.post)
    return optimizer


def wrap_h2d(obj: Any) -> Any:
    """Return ``obj`` with timed ``.to()`` / ``.cuda()`` calls."""
    from traceml_otel.capture.wrappers import TimedTransfer

    recorder = _recorder_for("wrap_h2d", "h2d")
    return obj if recorder is None else TimedTransfer(obj, recorder)


def _count_internal_error(telemetry: _NoopTelemetry) -> None:
    if isinstance(telemetry, _Telemetry):
        if telemetry.internal_errors == 0:
            _warn("an internal instrumentation error was ignored (training continues)")
        telemetry.internal_errors += 1


def _warn_not_initialised() -> None:
    global _warned_not_initialised
    if not _warned_not_initialised and _init_config is None:
        _warned_not_initialised = True
        _warn("trace_step() called before traceml.init(); telemetry is off")


def _forget_in_child() -> None:
    """After fork (DataLoader workers): the child must not write to the parent's pipe."""
    global _telemetry
    telemetry, _telemetry = _telemetry, _NOOP
    if isinstance(telemetry, _Telemetry):
        telemetry._closed = True
        telemetry.channel.detach()
        if telemetry.watchdog is not None:  # its thread did not survive the fork; its parent may ask
            telemetry.watchdog = None  # for this child's stacks (a DataLoader worker) on a hang
            from traceml_otel.capture.worker_stacks import arm_in_child

            arm_in_child()


def _install_sigterm_flush() -> None:
    """On SIGTERM, flush completed steps, then let the previous handler act."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    flushing = False

    def on_sigterm(signum: int, frame: Any) -> None:
        # A repeated SIGTERM must not cut the first one's flush short: Python runs a handler again
        # inside a running one, and the kernel sends the parent-death signal once per exiting thread
        # of a SIGKILLed launcher. The first call ends the process when its flush is done.
        nonlocal flushing
        if flushing:
            return
        global _telemetry
        telemetry, _telemetry = _telemetry, _NOOP
        flushing = True
        try:
            telemetry.shutdown(status="SIGTERM")  # bounded by TRACEML_SHUTDOWN_TIMEOUT_S
        finally:
            flushing = False
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def _install_exit_status_hook() -> None:
    """Record an uncaught exception (Ctrl-C included) so the exit-time flush names it, not "ok"."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        global _exit_status
        interrupted = issubclass(kind, KeyboardInterrupt)
        _exit_status = "SIGINT (Ctrl-C)" if interrupted else f"exception {kind.__name__}"
        previous(kind, value, tb)

    sys.excepthook = hook


def _stop_with_launcher() -> None:
    try:
        from traceml_otel.capture.orphan import stop_with_launcher

        stop_with_launcher()
    except Exception as error:  # never a reason not to train
        _warn(f"cannot arrange to stop with the launcher: {type(error).__name__}: {error}")
