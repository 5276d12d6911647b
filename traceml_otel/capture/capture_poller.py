"""Deep captures' requests, read off the training thread, and their limits.

A daemon thread looks every ``TRACEML_CAPTURE_POLL_S`` (0.2 s) at three small files in the run folder:
``capture-request.json`` (``traceml capture``, for every rank or the ranks it names),
``rank-R.capture-demand.json`` (``POST /capture`` on this rank's metrics port) and
``rank-R.capture-request.json`` (this rank's emitter, when a trigger fired). An on-demand request that
finds a capture running waits for its end. A file whose inode, size and
modification time did not change (``FileChange``) is not read again; a changed one is read bounded (16 KiB),
checked field by field, and a request id already handled is ignored. Requests present when the rank
starts and older than a minute, or (in a restarted attempt) made before its process started, belong to
an earlier attempt: ignored.

Limits (``TRACEML_CAPTURE_*``): one capture per rank per ``INTERVAL_S`` and the cost budget
(``capture/capture_budget.py``; automatic triggers only: an on-demand request is a person's, and skips
both; an automatic capture whose export would not fit the budget is taken with its export deferred,
released here once the training-time share covers it), ``MAX`` per rank, ``MAX_RUN`` captures started in
the run folder (a slot file claimed atomically as a capture is taken, all ranks together) and ``MAX_MB``
of traces in it. Each refusal is counted by reason in ``rank-R.capture-status.json``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from traceml_otel.capture.capture_budget import budget_refusal, export_now
from traceml_otel.capture.time_ledger import process_start_time
from traceml_otel.wire._json import RecordError, write_atomically
from traceml_otel.wire.bounded_file import FileChange
from traceml_otel.wire.capture_in_flight import CaptureInFlight, in_flight_file_name, write_in_flight
from traceml_otel.wire.capture_record import (
    REQUEST_FILE,
    CaptureRequest,
    demand_file_name,
    read_request,
    request_file_name,
    status_file_name,
)

if TYPE_CHECKING:
    from traceml_otel.capture.profiler_capture import ProfilerCapture
    from traceml_otel.settings import CaptureSettings

MAX_HANDLED = 256
BUSY = "a capture is running"
AUTO_OFF = "automatic captures off"
"""An automatic request on a rank whose automatic captures are off (this attempt, after an earlier one
ended mid-capture: ``capture_start.earlier_crash``)."""
STALE_S = 60.0
"""A request found at start-up older than this belongs to an earlier attempt: ignored."""


class CapturePoller:
    """Reads capture requests for one rank and arms its :class:`ProfilerCapture` within the limits."""

    def __init__(self, capture: ProfilerCapture, run_dir: Path, rank: int, settings: CaptureSettings,
                 warn: Callable[[str], None], restart: int = 0) -> None:
        self.capture = capture
        self.run_dir = run_dir
        self.rank = rank
        self.settings = settings
        self.warn = warn
        self.paths = (run_dir / REQUEST_FILE, run_dir / demand_file_name(rank),
                      run_dir / request_file_name(rank))
        self._changes = {path: FileChange(path) for path in self.paths}
        self._handled: list[str] = []
        self.budget: dict[str, float] = {}
        """The cost budget's numbers at the last automatic request (``rank-R.capture-status.json``)."""
        self._defer = False
        """Whether the request being judged gets its export deferred (the cost budget)."""
        self.restart = restart
        """This attempt's ``TORCHELASTIC_RESTART_COUNT`` (written into the in-flight marker)."""
        self._marked: CaptureInFlight | None = None
        """The in-flight marker this poller keeps, while it does."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traceml-capture-poll", daemon=True)
        # An earlier attempt's requests: older than a minute, or, in a restarted attempt, made before this
        # process started (a capture that one attempt ended in is not taken again); one made while this
        # rank started is taken.
        born = process_start_time() if restart > 0 else None
        for path in self.paths:
            request = self._read_changed(path)
            if request is not None and (request.requested_unix < time.time() - STALE_S
                                        or (born is not None and request.requested_unix < born)):
                self._handled.append(request.id)
            elif request is not None:
                self._changes[path].forget()  # read again at the first poll

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.poll_s):
            try:
                self.poll()
            except Exception as error:  # never into training
                self.warn(f"capture requests are no longer read: {type(error).__name__}: {error}")
                return

    def poll(self) -> None:
        """One look at the request files (the thread's loop; tests call it directly)."""
        capture = self.capture
        if self._marked is not None and not capture.in_flight:
            self.clear_in_flight()
        elif self._marked is not None and not self._marked.running and capture.running is not None:
            self._write_marker(replace(self._marked, running=True))
        if capture.training_since is None and capture.session.recorder.step > 0:
            capture.training_since = time.monotonic()  # the budget's clock: from the first step seen
        if capture.exporter.deferred and capture.running is None:
            self._release_deferred()
        if capture.pending is not None:
            from traceml_otel.capture.step_state import NO_BLOCK as _NO_BLOCK

            capture.session.block_model = _NO_BLOCK  # a step start that raced the arming undid it
            return
        for path in self.paths:
            request = self._read_changed(path)
            if request is None or request.id in self._handled:
                continue
            if request.ranks and self.rank not in request.ranks:
                self._handled = [*self._handled[-MAX_HANDLED:], request.id]
                continue
            why = self.refusal(request)
            if why == BUSY and request.reason == "on_demand":
                self._changes[path].forget()  # a person asked: taken once the running capture ends
                continue
            self._handled = [*self._handled[-MAX_HANDLED:], request.id]
            if why is None:
                self._mark_in_flight(request)
                capture.arm(request, defer_export=self._defer)
            else:
                capture.refuse(why)
            self._write_status(request, why)
            if why is None:
                return

    def refusal(self, request: CaptureRequest) -> str | None:
        """Why ``request`` is not taken now (``None``: it is, and one of the run's capture slots is
        claimed for it, the last check)."""
        from traceml_otel.capture.capture_export import claim_run_slot, run_trace_usage

        capture, settings = self.capture, self.settings
        if capture.busy:
            return BUSY
        if capture.started >= settings.max_per_rank:
            return f"rank cap ({settings.max_per_rank} per run)"
        last = capture.last_started_monotonic
        automatic = request.reason != "on_demand"
        if automatic and not settings.auto:
            return AUTO_OFF
        if automatic and last is not None and time.monotonic() - last < settings.interval_s:
            return f"interval ({settings.interval_s:g} s per rank)"
        self._defer = False
        if automatic:
            use = capture.budget_use()
            train_s = capture.training_s()
            share, waste_share, wasted = settings.budget_share, settings.waste_share, request.wasted_s
            self._defer = not export_now(train_s, use, share)
            self.budget = {"share": share, "waste_share": waste_share, "train_s": round(train_s, 3),
                           "wasted_s": round(wasted, 4), "spent_s": round(use.spent_s, 4),
                           "expected_s": round(use.run_expected_s, 4),
                           "export_expected_s": round(use.export_expected_s, 4),
                           "export_deferred": float(self._defer)}
            over = budget_refusal(train_s, use.spent_s, use.run_expected_s, share, wasted, waste_share)
            if over is not None:
                return over
        _, size = run_trace_usage(self.run_dir)
        if size >= settings.max_run_bytes:
            return f"run cap ({settings.max_run_bytes >> 20} MiB)"
        if claim_run_slot(self.run_dir, self.rank, settings.max_per_run) is None:
            return f"run cap ({settings.max_per_run} captures)"
        return None

    def _mark_in_flight(self, request: CaptureRequest) -> None:
        """Leave ``rank-R.capture-running.A.json`` until the profiler has stopped (a crash keeps it)."""
        self._write_marker(CaptureInFlight(
            rank=self.rank, request=request.id, reason=request.reason, with_stack=self.settings.with_stack,
            armed_unix=time.time(), restart=self.restart, run_id=self.capture.exporter.run_id,
            at_step=request.at_step))

    def _write_marker(self, marker: CaptureInFlight) -> None:
        try:
            write_in_flight(self.run_dir, marker)
            self._marked = marker
        except OSError:
            pass  # a folder that cannot be written takes no trace either; the capture still runs

    def clear_in_flight(self) -> None:
        """The capture's profiler stopped (or it never started, or the rank ends cleanly): no marker."""
        if self._marked is None:
            return  # only this attempt's own marker: an earlier attempt's stays the record of its end
        self._marked = None
        try:
            (self.run_dir / in_flight_file_name(self.rank, self.restart)).unlink(missing_ok=True)
        except OSError:
            pass

    def _release_deferred(self) -> None:
        """Export a deferred capture once the training-time share alone covers its export (the anomaly's
        share paid for the profiling, not for holding the GIL later)."""
        capture = self.capture
        use = capture.budget_use()
        if use.spent_s + use.export_expected_s <= self.settings.budget_share * capture.training_s():
            capture.exporter.release()

    def _read_changed(self, path: Path) -> CaptureRequest | None:
        if not self._changes[path].changed():
            return None
        try:
            return read_request(path)
        except RecordError as error:
            self.warn(f"capture request ignored: {str(error)[:200]}")
            return None

    def _write_status(self, request: CaptureRequest, why: str | None) -> None:
        capture = self.capture
        settings = self.settings
        record = {"version": 1, "rank": self.rank, "started": capture.started + (why is None),
                  "refused": dict(capture.refused), "last_request": request.id,
                  "last_reason": request.reason, "last_refusal": why or "",
                  "limits": {"interval_s": settings.interval_s, "max_per_rank": settings.max_per_rank,
                             "max_per_run": settings.max_per_run, "max_run_mb": settings.max_run_bytes >> 20,
                             "steps": settings.steps, "budget_share": settings.budget_share},
                  "budget": dict(self.budget)}
        try:
            write_atomically(self.run_dir / status_file_name(self.rank), json.dumps(record))
        except OSError:
            pass
