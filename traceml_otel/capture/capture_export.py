"""Deep captures' writing, off the training thread: the trace (gzip, bounded) and its summary record.

One daemon thread per rank, at nice +10, takes stopped profilers from a queue of one: the training
thread hands a capture over and goes on (``capture/profiler_capture.py``). The trace is exported by
``torch.profiler``'s own ``export_chrome_trace`` into a temporary file inside the run folder, then
gzipped to ``rank-R.capture-N.trace.json.gz``; a trace over its cap (a quarter of
``TRACEML_CAPTURE_MAX_MB``, or what the run's cap has left) is deleted and the summary says so.

An automatic capture whose export does not fit the cost budget (``capture/capture_budget.py``) is
*deferred*: the stopped profiler is kept (its results, a few MiB at most) and exported when the poller
finds the budget covers it (:meth:`CaptureExporter.release`) or when the rank shuts down
(:meth:`CaptureExporter.close`, after the training: it costs the training nothing then).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import queue
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_otel.capture.capture_budget import capture_cost_s
from traceml_otel.wire.capture_record import (
    CaptureRequest,
    CaptureSummary,
    summary_file_name,
    trace_file_name,
    write_summary,
)

if TYPE_CHECKING:
    from traceml_otel.capture.running_capture import RunningCapture
    from traceml_otel.settings import CaptureSettings

USER_PROFILER = "a profiler is already running in this process (the user's): no capture is taken"

MAX_DEFERRED = 8
"""At most this many stopped captures wait for their export (each holds its profiler's results)."""
RAW_FACTOR = 12
"""The uncompressed trace may be this many times the gzip cap (Chrome JSON compresses ~10x)."""


def run_trace_usage(run_dir: Path) -> tuple[int, int]:
    """(capture traces, their bytes) in the run folder, all ranks together."""
    count = size = 0
    try:
        for entry in os.scandir(run_dir):
            if entry.name.endswith(".trace.json.gz") and ".capture-" in entry.name:
                count += 1
                with contextlib.suppress(OSError):
                    size += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return count, size


SLOT_PREFIX = ".capture-slot-"
"""``.capture-slot-N`` (N below ``TRACEML_CAPTURE_MAX_RUN``): one file per capture the run has started."""


def claim_run_slot(run_dir: Path, rank: int, max_per_run: int) -> int | None:
    """Claim one of the run's ``max_per_run`` capture slots for ``rank``: the first ``.capture-slot-N``
    this process creates (``O_EXCL``, atomic on one file system), so ranks that start captures at the
    same moment (a job-wide anomaly seen by all 1,024 at once) never take more than the cap; a count of
    written traces would let them all through before the first is written. ``None``: every slot is
    taken, or the folder cannot be written (then no trace could be either)."""
    for number in range(max_per_run):
        try:
            handle = os.open(run_dir / f"{SLOT_PREFIX}{number}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        except OSError:
            return None
        with contextlib.suppress(OSError):
            os.write(handle, str(rank).encode())
        os.close(handle)
        return number
    return None


class CaptureExporter:
    """Writes captures handed over by the training thread, one at a time, on its own thread."""

    def __init__(self, run_dir: Path, run_id: str, rank: int, settings: CaptureSettings,
                 warn: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.rank = rank
        self.settings = settings
        self.warn = warn
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.written: list[CaptureSummary] = []
        self.dropped = 0
        """Captures handed over while one was still being written (the queue holds one): counted."""
        self.baseline_ms: float | None = None
        self.deferred: list[Any] = []
        """Stopped automatic captures whose export waits (the cost budget); at most :data:`MAX_DEFERRED`."""
        self.auto_exporting = 0
        """Automatic captures handed to the thread and not yet written (their export counts as expected)."""
        self.export_costs: list[tuple[bool, float]] = []
        """(automatic?, export seconds charged to the training: 0 for one written after it) per capture."""
        self.last_export_s = 0.0
        """The last export's measured wall time (the next one's expected cost)."""
        self.lost_at_exit = 0
        """Deferred captures still unwritten when the shutdown's wait ran out: counted and said."""
        self.unwritten: list[tuple[Any, str]] = []
        """(capture, why) of each capture dropped unwritten: each gets a summary saying so at :meth:`close`
        (written then, off the training thread), so the report counts it."""
        self._training_over = False
        self._thread = threading.Thread(target=self._run, name="traceml-capture-export", daemon=True)
        self._thread.start()

    def submit(self, running: RunningCapture) -> None:
        """Hand a stopped capture over (never blocks; a full queue drops it, counted and said). A deferred
        one is kept for :meth:`release` or the shutdown."""
        if running.deferred:
            if len(self.deferred) >= MAX_DEFERRED:
                self.dropped += 1
                why = f"dropped: {MAX_DEFERRED} captures already waited for export"
                self.unwritten.append((running, why))
                self.warn(f"capture {running.index} {why}")
                return
            self.deferred.append(running)
            return
        automatic = running.request.reason != "on_demand"
        try:
            self._queue.put_nowait(running)
        except queue.Full:
            self.dropped += 1
            why = "dropped: the previous capture was still being written"
            self.unwritten.append((running, why))
            self.warn(f"capture {running.index} {why}")
            return
        self.auto_exporting += automatic

    def release(self) -> bool:
        """Hand the oldest deferred capture to the thread (the poller: the budget now covers its export);
        whether one was handed over."""
        if not self.deferred:
            return False
        running = self.deferred[0]
        try:
            self._queue.put_nowait(running)
        except queue.Full:
            return False
        self.deferred.pop(0)
        self.auto_exporting += 1
        return True

    def note_user_profiler(self, request: CaptureRequest) -> None:
        """Record, once, that captures are refused because the user's profiler runs."""
        self._queue.put(("user", request)) if self._queue.empty() else None

    def close(self, wait_s: float) -> None:
        """Let the thread finish what it holds and the deferred exports (after the training: they cost it
        nothing), at most ``wait_s`` in all, then stop it. Captures left unwritten are counted and said."""
        deadline = time.monotonic() + wait_s
        self._training_over = True
        while self.deferred:
            with contextlib.suppress(queue.Full):
                self._queue.put(self.deferred[0], timeout=max(0.0, deadline - time.monotonic()))
                self.deferred.pop(0)
                self.auto_exporting += 1
                continue
            break
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = len(self.deferred) + (self._queue.qsize() if self._thread.is_alive() else 0)
        if left:
            self.lost_at_exit += left
            self.warn(f"{left} capture(s) not written: the shutdown's wait ({wait_s:g} s) ran out")
        self.unwritten += [(running, f"not written: the shutdown's wait ({wait_s:g} s) ran out")
                           for running in self.deferred]
        self.deferred = []
        for running, why in self.unwritten:
            self._record_unwritten(running, why)

    def _record_unwritten(self, running: Any, why: str) -> None:
        """A summary that says why capture ``running`` has no trace (what it captured, no operators)."""
        with contextlib.suppress(Exception):  # never into training or its shutdown
            request = running.request
            write_summary(self.run_dir, CaptureSummary(
                run_id=self.run_id, rank=self.rank, index=running.index, reason=request.reason,
                detail=request.detail, request_id=request.id, steps=tuple(running.steps),
                step_ms=tuple(running.step_ms), problem=why, started_unix=running.started_unix,
                stopped_unix=running.stopped_unix, finished_unix=time.time()))

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # Linux: a thread's own niceness
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if isinstance(item, tuple):
                    self._write_refusal(item[1])
                else:
                    self._export(item)
            except Exception as error:  # never into training
                self.warn(f"a capture could not be written: {type(error).__name__}: {str(error)[:200]}")

    def _write_refusal(self, request: CaptureRequest) -> None:

        write_summary(self.run_dir, CaptureSummary(
            run_id=self.run_id, rank=self.rank, index=0, reason=request.reason, detail=request.detail,
            request_id=request.id, problem=USER_PROFILER, finished_unix=time.time()))

    def _export(self, running: RunningCapture) -> None:
        automatic = running.request.reason != "on_demand"
        try:
            self._export_one(running)
        finally:
            if automatic:
                self.auto_exporting = max(0, self.auto_exporting - 1)

    def _export_one(self, running: RunningCapture) -> None:
        from traceml_otel.capture.capture_summary import summarize

        after_training = self._training_over
        began = time.monotonic()
        began_unix = time.time()
        name = trace_file_name(self.rank, running.index)
        note = ""
        try:  # before the export, which leaves the profiler's results unreadable to Python at times
            tables: dict[str, Any] = summarize(running.profiler, self.settings.with_stack)
        except Exception as error:  # torch could not read its own events back: the trace may still open
            tables = {}
            where = traceback.extract_tb(error.__traceback__)[-1]
            note = (f"the profiler's events could not be summarised ({type(error).__name__}: "
                    f"{str(error)[:80]}, in {Path(where.filename).name}:{where.lineno})")
        trace_bytes, problem = self._write_trace(running.profiler, name)
        problem = "; ".join(text for text in (problem, note) if text)
        settings = self.settings
        summary = CaptureSummary(
            run_id=self.run_id, rank=self.rank, index=running.index, reason=running.request.reason,
            detail=running.request.detail, request_id=running.request.id, steps=tuple(running.steps),
            step_ms=tuple(round(ms, 3) for ms in running.step_ms), median_ms=_baseline(running.request),
            trace_file=name if trace_bytes else "", trace_bytes=trace_bytes, activities=running.activities,
            with_stack=settings.with_stack, record_shapes=settings.record_shapes, problem=problem,
            limits={"steps": float(running.steps_wanted), "interval_s": settings.interval_s,
                    "max_per_rank": float(settings.max_per_rank), "max_per_run": float(settings.max_per_run),
                    "max_run_mb": settings.max_run_bytes / (1 << 20),
                    "budget_share": settings.budget_share,
                    "start_s": round(running.start_overhead_s, 4),
                    "stop_s": round(running.stop_overhead_s, 4)},
            **tables,
        )
        export_s = time.monotonic() - began
        charged = 0.0 if after_training else export_s  # written after the training: it lost nothing
        cost = capture_cost_s(running.start_overhead_s, running.stop_overhead_s, running.step_ms,
                              running.request.baseline_ms, charged)
        summary = replace(summary, export_s=round(export_s, 3), finished_unix=time.time(),
                          started_unix=running.started_unix, stopped_unix=running.stopped_unix,
                          cost_s=round(cost, 4), train_s=round(running.train_s, 3),
                          export_began_unix=began_unix, export_deferred=running.deferred,
                          export_after_training=after_training)
        self.last_export_s = export_s
        self.export_costs = [*self.export_costs[-63:], (running.request.reason != "on_demand", charged)]
        write_summary(self.run_dir, summary)
        self.written.append(summary)
        written = self.run_dir / (name if trace_bytes else summary_file_name(self.rank, running.index))
        steps = f"{running.steps[0]}-{running.steps[-1]}" if running.steps else "none"
        share = f", {cost / running.train_s:.1%} of the training so far" if running.train_s > 0 else ""
        share += "; written after the training" if after_training and running.deferred else ""
        self.warn(f"capture {running.index} ({running.request.reason}, steps {steps}) written: {written} "
                  f"(cost the training thread at most {cost:.2f} s{share})")

    def _write_trace(self, profiler: Any, name: str) -> tuple[int, str]:
        """Export, gzip and bound the trace; (its bytes, or 0 with the reason in words)."""
        settings = self.settings
        count, used = run_trace_usage(self.run_dir)
        cap = min(settings.max_run_bytes // 4, settings.max_run_bytes - used)
        if cap <= 0 or count >= settings.max_per_run:
            return 0, "the run's cap on capture traces is reached: summary only"
        raw = self.run_dir / f".{name}.part.json"
        packed = self.run_dir / f".{name}.part"
        try:
            profiler.export_chrome_trace(str(raw))
            if raw.stat().st_size > cap * RAW_FACTOR:
                return 0, f"trace of {raw.stat().st_size >> 20} MiB over the cap: summary only"
            with open(raw, "rb") as source, gzip.open(packed, "wb", compresslevel=6) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            size = packed.stat().st_size
            if size > cap:
                return 0, f"gzipped trace of {size >> 20} MiB over the cap of {cap >> 20} MiB: summary only"
            os.replace(packed, self.run_dir / name)
            return size, ""
        except OSError as error:
            return 0, f"trace not written: {type(error).__name__}: {str(error)[:120]}"
        finally:
            for path in (raw, packed):
                with contextlib.suppress(OSError):
                    path.unlink()


def _baseline(request: CaptureRequest) -> float | None:
    return request.baseline_ms if request.baseline_ms else None
