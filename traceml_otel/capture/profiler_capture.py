"""Deep captures on the training thread: ``torch.profiler`` on for a few whole steps, then off.

Nothing here runs per step while no capture is asked for. The poller (``capture/capture_poller.py``,
its own thread) arms a capture by setting :attr:`ProfilerCapture.pending` and the session's
``block_model`` to the sentinel that sends ``trace_step`` through the session's full path
(``Session.begin_step``), which is where a step's start checks for a capture: so an unarmed step pays
nothing, not even an attribute read (``benchmarks/step_instructions.py`` counts the same bytecodes).

While armed, the next step's start (before its clock reading) starts the profiler; after N steps' ends
(after their clock readings) it is stopped, and the trace's export and summary go to the exporter
thread (``capture/capture_export.py``): the training thread never waits for a write. The start and
the stop are kept out of the steps' own time and out of the gap between steps (``enter_outside``).

A profiler the user already runs is never doubled: the capture is refused, said once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from traceml_otel.capture.capture_export import USER_PROFILER
from traceml_otel.capture.running_capture import RunningCapture
from traceml_otel.wire.capture_record import CaptureRequest

if TYPE_CHECKING:
    from traceml_otel.capture.capture_budget import BudgetUse
    from traceml_otel.capture.capture_export import CaptureExporter
    from traceml_otel.capture.recorder import StepRecorder
    from traceml_otel.settings import CaptureSettings

FIRST_STEP = 5
"""No capture covers a rank's first steps: ``torch.profiler``'s Python tracer at times garbles the names
of what runs for the first time in a process (its events then cannot be read back), and first steps
are warm-up anyway."""
KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
QUIET_KINETO = "6"
"""Above kineto's highest level (USDT, 5): none of its messages (``docs/captures.md``)."""


class CaptureHost(Protocol):
    """What a capture needs of the training session (``capture/session.py``'s ``TrainingSession``)."""

    recorder: StepRecorder
    block_model: Any
    """Set to the sentinel that sends ``trace_step`` through the session's full path while armed."""

    def end_step(self, exception_type: str | None) -> None:
        """Close the open step (a capture puts its own in place while it runs)."""


def user_profiler_running() -> bool:
    """Whether ``torch.profiler`` / ``torch.autograd.profiler`` is already on in this process."""
    import torch

    try:
        if torch._C._autograd._profiler_enabled():
            return True
    except Exception:
        pass
    try:
        from torch.autograd import profiler as autograd_profiler

        return bool(getattr(autograd_profiler, "_is_profiler_enabled", False))
    except Exception:
        return False


class ProfilerCapture:
    """One rank's deep captures: armed by the poller, run on the training thread, exported off it."""

    def __init__(self, session: CaptureHost, settings: CaptureSettings, exporter: CaptureExporter,
                 warn: Callable[[str], None]) -> None:
        self.session = session
        self.settings = settings
        self.exporter = exporter
        self.warn = warn
        self.pending: CaptureRequest | None = None
        """Set by the poller; taken at the next step's start."""
        self.running: RunningCapture | None = None
        self.started = 0
        """Captures started in this process (their index is this count)."""
        self.refused: dict[str, int] = {}
        """Requests not taken, by why (rate limits, the user's profiler, a failed start)."""
        self._said_user_profiler = False
        self.last_started_monotonic: float | None = None
        self.training_since: float | None = None
        """Monotonic time of the rank's first step, as the poller saw it (the cost budget's clock)."""
        self.auto_started = 0
        """Automatic captures started (their costs count against the budget)."""
        self.defer_export = False
        """Set by the poller with :meth:`arm`: the next capture's export waits (the cost budget)."""
        self.run_costs: list[tuple[bool, float]] = []
        """(automatic?, profiling cost in seconds) of each capture stopped, in order."""
        self.in_flight = False
        """From :meth:`arm` until the profiler has stopped, or the capture did not start: while it is
        true the poller keeps ``rank-R.capture-running.A.json`` (``wire/capture_in_flight.py``)."""

    @property
    def busy(self) -> bool:
        """A capture is pending or running (``trace_step`` must take the session's full path)."""
        return self.pending is not None or self.running is not None

    def arm(self, request: CaptureRequest, defer_export: bool = False) -> None:
        """Ask for a capture at the next step's start (any thread; the poller calls it); ``defer_export``:
        its export waits for the cost budget (or the end of training)."""
        from traceml_otel.capture.step_state import NO_BLOCK as _NO_BLOCK

        self.defer_export = defer_export
        self.in_flight = True
        self.pending = request
        self.session.block_model = _NO_BLOCK  # the next trace_step takes Session.begin_step

    def training_s(self) -> float:
        """The rank's training time so far (since its first step; 0 before it)."""
        since = self.training_since
        return time.monotonic() - since if since is not None else 0.0

    def budget_use(self) -> BudgetUse:
        """The automatic captures' measured costs so far and the next one's expected costs: profiling
        from the captures stopped (a started one counts as expected), exports from the written
        summaries of those run during training (one being written counts as expected)."""
        from traceml_otel.capture.capture_budget import DEFAULT_COST_S, DEFAULT_RUN_COST_S, BudgetUse

        runs = list(self.run_costs)
        run_expected = runs[-1][1] if runs and runs[-1][1] > 0 else DEFAULT_RUN_COST_S
        auto_runs = [cost for automatic, cost in runs if automatic]
        spent = sum(auto_runs) + run_expected * max(0, self.auto_started - len(auto_runs))
        exporter = self.exporter
        export_expected = exporter.last_export_s or DEFAULT_COST_S
        spent += sum(cost for automatic, cost in list(exporter.export_costs) if automatic)
        spent += export_expected * exporter.auto_exporting
        return BudgetUse(spent, run_expected, export_expected)

    def refuse(self, why: str) -> None:
        """Count a request not taken (the poller's limits, or here)."""
        self.refused[why] = self.refused.get(why, 0) + 1

    # --- the training thread ---------------------------------------------------------------
    def before_step(self) -> None:
        """A step is about to open (``Session.begin_step``, before its clock reading): start a pending
        capture (when its ``at_step`` has come)."""
        request = self.pending
        if request is None or self.running is not None:
            return
        recorder = self.session.recorder
        if recorder.step < FIRST_STEP:
            return  # kept pending until then
        at = request.at_step
        if at is not None:
            if request.every and recorder.step > at + 1:  # the predicted step went by: the next one
                periods = -(-(recorder.step - at - 1) // request.every)
                at += periods * request.every
                self.pending = request = replace(request, at_step=at)
            if recorder.step < at:
                return  # armed for a later step (a periodic spike's predicted one)
        self.pending = None
        if recorder.in_step:
            self.pending = request  # a nested block: the outer step's end comes first
            return
        if user_profiler_running():
            self.in_flight = False
            self.refuse("user profiler")
            if not self._said_user_profiler:
                self._said_user_profiler = True
                self.warn(USER_PROFILER)
                self.exporter.note_user_profiler(request)
            return
        recorder.enter_outside("profiler")
        began = time.perf_counter()
        try:
            profiler, activities = self._start_profiler()
        except Exception as error:
            self.in_flight = False
            self.refuse("profiler start failed")
            self.warn(f"a capture could not start: {type(error).__name__}: {str(error)[:200]}")
            return
        finally:
            recorder.exit_outside()
        self.started += 1
        self.auto_started += request.reason != "on_demand"
        self.last_started_monotonic = now = time.monotonic()
        since = self.training_since
        self.running = RunningCapture(
            index=self.started, request=request, profiler=profiler,
            steps_wanted=request.steps or self.settings.steps, activities=activities,
            start_overhead_s=time.perf_counter() - began, started_unix=time.time(),
            train_s=now - since if since is not None else 0.0,
            deferred=self.defer_export and request.reason != "on_demand",
        )
        self.session.end_step = self.end_step  # type: ignore[method-assign]

    def _start_profiler(self) -> tuple[Any, tuple[str, ...]]:
        from torch.profiler import ProfilerActivity, profile

        # torch's profiler library (kineto) prints "USDT: ... profiler_start" and "profiler_stop" lines
        # to stderr at every start at its default level: a capture must not write into the user's
        # output. It reads the level at its first start; one the user set is kept.
        os.environ.setdefault(KINETO_LOG_LEVEL, QUIET_KINETO)

        activities = [ProfilerActivity.CPU]
        names = ["cpu"]
        if self.session.recorder.device:
            activities.append(ProfilerActivity.CUDA)
            names.append("cuda")
        profiler = profile(activities=activities, record_shapes=self.settings.record_shapes,
                           with_stack=self.settings.with_stack)
        profiler.start()
        return profiler, tuple(names)

    def end_step(self, exception_type: str | None = None) -> None:
        """The session's ``end_step`` while a capture runs: the recorder's, then count the step."""
        recorder = self.session.recorder
        opened = recorder.in_step
        recorder.end_step(exception_type)
        running = self.running
        if running is None or not opened:
            return
        running.steps.append(recorder.step - 1)
        running.step_ms.append((recorder.last_step_end_ns or 0) / 1e6 - recorder.state.start_ns / 1e6)
        if len(running.steps) >= running.steps_wanted:
            self.stop()

    def stop(self) -> None:
        """Stop the running capture (after its last step, or at shutdown) and hand it to the exporter."""
        running, self.running = self.running, None
        session = self.session
        session.end_step = session.recorder.end_step  # type: ignore[method-assign]
        if running is None:
            return
        recorder = session.recorder
        recorder.enter_outside("profiler")
        began = time.perf_counter()
        try:
            running.profiler.stop()
        except Exception as error:
            self.warn(f"a capture could not stop cleanly: {type(error).__name__}: {str(error)[:200]}")
            return
        finally:
            recorder.exit_outside()
            self.in_flight = False
        running.stop_overhead_s = time.perf_counter() - began
        running.stopped_unix = time.time()
        from traceml_otel.capture.capture_budget import capture_cost_s

        running.run_cost_s = capture_cost_s(running.start_overhead_s, running.stop_overhead_s,
                                            running.step_ms, running.request.baseline_ms, 0.0)
        self.run_costs = [*self.run_costs[-63:], (running.request.reason != "on_demand", running.run_cost_s)]
        self.exporter.submit(running)  # never blocks: the exporter's queue holds one capture at most
