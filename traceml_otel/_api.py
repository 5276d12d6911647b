"""The public API: ``init``, ``trace_step``, ``outside_step``, the ``wrap_*`` helpers, ``flush`` and
``shutdown``: a facade over the process's training session (:mod:`traceml_otel.capture.session`),
which ``init()`` builds (:mod:`traceml_otel.session_root`).

``init()`` fails open: when telemetry cannot start it warns once on stderr and every
call below becomes a no-op (``strict=True`` or ``TRACEML_STRICT=1`` raises instead).
User exceptions inside ``trace_step`` always propagate; errors of our own are counted,
reported once, and never reach the training loop.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Literal

from traceml_otel import session_root
from traceml_otel.capture import process_hooks
from traceml_otel.capture import session as sessions
from traceml_otel.capture.capture_config import capture_config
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.capture.session import current
from traceml_otel.sanitize import strip_control
from traceml_otel.warn_line import warn

_warned_not_initialised = False
_warned_outside_in_step = False


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
    config = capture_config(mode, {
        "dataloader": patch_dataloader, "forward": patch_forward, "backward": patch_backward,
        "optimizer": patch_optimizer, "h2d": patch_h2d,
    }, collectives)
    return session_root.start(config, disabled=disabled, strict=strict)


class _StepWork:
    """What a ``trace_step`` call declared beyond the model (rare: most calls pass the model alone)."""

    __slots__ = ("counter", "flops", "measure", "samples", "tokens")

    def __init__(self, samples: int | None, tokens: int | None, flops: float | None, measure: bool) -> None:
        self.samples = samples
        self.tokens = tokens
        self.flops = flops
        self.measure = measure
        self.counter: Any = None


class _StepContext:
    """One ``trace_step`` block. The usual call (the model alone) sets two slots: it runs every step,
    so :func:`trace_step` makes it with ``object.__new__`` and sets them itself, as ``__init__`` does
    (a call of ``__init__`` from the class's constructor is a Python frame of its own)."""

    __slots__ = ("_model", "_opened", "_session", "_work")

    def __init__(self, model: Any, work: _StepWork | None = None) -> None:
        self._model = model
        self._work = work

    def __enter__(self) -> None:
        session = self._session = sessions._current  # current() without the call: every step runs this
        self._opened = False
        try:
            work = self._work
            if work is None:
                self._opened = session.begin_step(self._model)
                return
            self._opened = session.begin_step(self._model, work.samples, work.tokens)
            if self._opened and work.measure and session.time_ledger is not None:
                from traceml_otel.capture.flops import StepFlopCounter

                counter = StepFlopCounter()
                work.counter = counter if counter.start() else None
        except Exception:
            session.count_internal_error()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if not self._opened:  # a nested block, or telemetry off
            return False
        self._opened = False
        session = self._session
        try:
            work = self._work
            if work is None:
                session.end_step(None if exc_type is None else exc_type.__name__)
                return False
            counted = work.counter.stop() if work.counter is not None else None
            work.counter = None
            session.end_step(exc_type.__name__ if exc_type is not None else None)
            ledger = session.time_ledger
            if ledger is not None and work.flops is not None:
                ledger.declare_step_flops(work.flops)
            if ledger is not None and counted is not None:
                from traceml_otel.capture.flops import device_name

                recorder = session.recorder
                if recorder is not None:
                    ledger.measured_flops(counted, recorder.step - 1, device_name())
        except Exception:
            session.count_internal_error()
        return False


_new_context = object.__new__


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
) -> contextlib.AbstractContextManager[None]:
    """Context manager around one training step (zero_grad → forward → backward → step).

    Pass the model (or its DDP/FSDP wrapper) so its outermost forward is timed. ``samples`` and
    ``tokens`` declare the step's work (per rank); without ``samples``, the batch dimension of what
    the DataLoader returned is used. Blocks do not nest: an inner block is not counted.
    ``flops``: the model FLOPs of this whole step on this rank (every micro-batch of it), for MFU.
    ``measure_flops=True``: count them with ``FlopCounterMode`` in this one step (use it once; the
    count is then used for every step). See ``docs/goodput.md``.
    """
    session = sessions._current  # current() without the call: every step runs this
    if samples is None and tokens is None and flops is None and measure_flops is False:  # the usual call
        if model is session.block_model:  # the session's recorder is the block (two calls a step)
            return session.recorder
        if not session.active:
            _warn_not_initialised()
        context = _new_context(_StepContext)  # _StepContext(model) without a Python frame for __init__
        context._model = model
        context._work = None
        return context
    if not session.active:
        _warn_not_initialised()
    measure = measure_flops is not False and bool(measure_flops)
    return _StepContext(model, _StepWork(_work("samples", samples), _work("tokens", tokens),
                                         None if flops is None else _flops(flops), measure))


def _flops(value: float | None) -> float | None:
    """A declared FLOPs count, or ``None`` (with one warning) when it is not a finite number >= 0."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number != number or number < 0 or number == float("inf"):
        warn(f"flops={strip_control(repr(value))[:40]} is not a finite number of FLOPs >= 0; ignored")
        return None
    return number


def declare_flops(*, per_sample: float | None = None, per_token: float | None = None) -> None:
    """Declare the model FLOPs of one training sample or token (forward and backward), for MFU.

    The analyzer multiplies it by each step's samples or tokens (``trace_step(samples=, tokens=)``
    or the loader's batch size). Call it after ``init()``; see ``docs/goodput.md``.
    """
    ledger = current().time_ledger
    if ledger is None:
        if not session_root.init_called():
            warn("declare_flops() called before traceml.init(); ignored")
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
    ledger = current().time_ledger
    if ledger is None:
        if not session_root.init_called():
            warn("resume_from() called before traceml.init(); ignored")
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
        session = current()
        recorder = session.recorder
        self._entered.append(recorder)
        if recorder is None:
            return
        if recorder.in_step:
            _warn_outside_in_step(self._kind)
        recorder.enter_outside(self._kind)
        if session.time_ledger is not None:
            session.time_ledger.enter_outside()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        recorder = self._entered.pop() if self._entered else None
        if recorder is not None:
            recorder.exit_outside()
            session = current()
            ledger = session.time_ledger
            if ledger is not None:
                try:
                    ledger.exit_outside(self._kind, recorder.in_step)
                except Exception:
                    session.count_internal_error()
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
        warn(f"outside_step({strip_control(kind)[:40]!r}) was entered inside a trace_step() block, so that "
              "step's span covers it; call it between steps (warned once)")


def flush() -> None:
    """Hand every completed step to the emitter now."""
    session = current()
    try:
        session.flush()
    except Exception:
        session.count_internal_error()


def shutdown() -> None:
    """Flush and stop telemetry; waits for the local copy and (bounded) for OTLP export."""
    process_hooks.end_session()


def _recorder_for(helper: str, auto_flag: str) -> StepRecorder | None:
    session = current()
    if session.recorder is None:
        _warn_not_initialised()
        return None
    if getattr(session.config, auto_flag):
        raise ValueError(f"{helper}() would double count: the automatic {auto_flag} hook is active")
    return session.recorder


def wrap_dataloader_fetch(loader: Iterable[Any]) -> Iterable[Any]:
    """Time each ``next()`` on ``loader`` as input wait: any iterable, iterator or generator (a
    streaming reader, slices of tensors in memory), or a DataLoader when its automatic hook is off."""
    from traceml_otel.capture.wrappers import TimedFetchIterator

    if not _is_torch_loader(loader):  # the automatic hook times DataLoader iterators only
        recorder = current().recorder
        if recorder is None:
            _warn_not_initialised()
            return loader
        return TimedFetchIterator(loader, recorder)
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
    if _recorder_for("wrap_forward", "forward") is not None:
        current().watch_model(model)
    return model


def wrap_backward(loss: Any) -> Any:
    """Return ``loss`` with a timed ``.backward()``."""
    from traceml_otel.capture.wrappers import TimedLoss

    recorder = _recorder_for("wrap_backward", "backward")
    return loss if recorder is None else TimedLoss(loss, recorder)


def wrap_optimizer(optimizer: Any) -> Any:
    """Time ``optimizer.step()``; returns the same object (GradScaler-safe)."""
    if _recorder_for("wrap_optimizer", "optimizer") is not None:
        current().watch_optimizer(optimizer)
    return optimizer


def wrap_h2d(obj: Any) -> Any:
    """Return ``obj`` with timed ``.to()`` / ``.cuda()`` calls."""
    from traceml_otel.capture.wrappers import TimedTransfer

    recorder = _recorder_for("wrap_h2d", "h2d")
    return obj if recorder is None else TimedTransfer(obj, recorder)


def _warn_not_initialised() -> None:
    global _warned_not_initialised
    if not _warned_not_initialised and not session_root.init_called():
        _warned_not_initialised = True
        warn("trace_step() called before traceml.init(); telemetry is off")
