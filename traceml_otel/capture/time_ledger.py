"""One rank's time outside its steps and its FLOPs, kept off the per-step path.

``outside_step`` blocks, a FLOPs declaration or measurement, ``init()`` and shutdown update a
:class:`TimeLedger`; it writes ``rank-R.time.json`` (:mod:`traceml_otel.wire.time_record`) at
``init()``, after an ``outside_step`` block (at once when it lasted ``min_interval_s`` or more, else
at most once per ``min_interval_s``), after the first FLOPs declaration and a FLOPs measurement, once
the first step named the training thread (``training_tid``, for the emitter's CPU samples), at
``resume_from()`` and at shutdown.

The writes during training (after a block, a FLOPs declaration or measurement, the first step) are made by the
ledger's writer thread: the training thread only signals it. A file write there would be telemetry's
time between two steps (milliseconds on a loaded host: a test once counted 20-50 ms of the ledger's
own writes and thread starts as ``between_steps``). The final record at shutdown is written on the
caller's thread, and no background write can replace it afterwards.

A step costs nothing here unless it declares ``flops=`` (two additions). A failed write is counted
and said once; it never reaches training.

Every duration is read on the monotonic clock (``perf_counter``); the record's times are one wall
anchor, read at construction, plus monotonic time, so a wall-clock step (NTP, a suspended VM) moves
no duration. Telemetry's own time at the end (the last hand-off, the final export, the metrics
endpoint's linger) is measured from :meth:`TimeLedger.telemetry_began` to the final record
(``telemetry_s``): the account bills it to ``telemetry``, not to the program's shutdown.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.capture.clock_anchor import wall_anchor_ns
from traceml_otel.capture.precision import MAX_MODELS_CHECKED, reduced_weights
from traceml_otel.contract import time_file_name
from traceml_otel.wire.time_record import (
    MAX_ATTEMPTS,
    MAX_KINDS,
    FlopsRecord,
    OutsideTotal,
    TimeRecord,
    read_time_record,
    write_time_record,
)


def restart_count() -> int:
    """This attempt's number under torchrun's restarts (``TORCHELASTIC_RESTART_COUNT``): 0 for the first
    attempt, and outside torchrun."""
    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(raw) if raw.isdigit() else 0


def process_start_time(pid: int | str = "self") -> float | None:
    """Unix time at which process ``pid`` (default: this one) started, from ``/proc`` (about 10 ms
    precision); ``None`` where ``/proc`` is not available."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as uptime_file:
            uptime = float(uptime_file.read().split()[0])
        ticks = int(fields[19])  # field 22 (starttime), counted after the ")" that ends field 2
        now = time.time()
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


EXEC_GAP_S = 1.0
"""A process whose interpreter vouches for a start this much later than its ``/proc`` start ran
something else first in the same process (a shell that slept, then exec'd it): see
:func:`own_start_time`."""


def runnable_seconds(pid: int | str = "self") -> float | None:
    """Seconds process ``pid``'s main thread has run or waited for a CPU (``/proc/PID/schedstat``);
    ``None`` where it cannot be read. Time asleep (a shell waiting for ``sleep``) is not in it."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as stat:
            run_ns, wait_ns = stat.read().split()[:2]
        return (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return None


def waited_for_children(pid: int | str = "self") -> bool:
    """Whether process ``pid`` has waited for a child (its children's page faults or CPU time are
    counted: ``/proc/PID/stat`` fields 11, 16 and 17; ``exec`` keeps them)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[8]) + int(fields[13]) + int(fields[14]) > 0
    except (OSError, ValueError, IndexError):
        return False


def own_start_time(
    pid: int | str = "self", seen: tuple[float, float | None, bool] | None = None,
) -> float | None:
    """When process ``pid``'s own program started: its ``/proc`` start (the fork), or, when the
    process had already waited for a child and its running time vouches for a start more than
    :data:`EXEC_GAP_S` later, that start (``seen``: (wall time, :func:`runnable_seconds`,
    :func:`waited_for_children`) then; read now when not given).

    A PID keeps its fork time across ``exec``: ``bash -c "sleep 20 && traceml run ..."`` (or a
    container entrypoint that installs packages first) execs the launcher in the shell's process, 20 s
    after the fork, once the shell has waited for ``sleep``. The shell sleeping is not runnable time,
    so wall time less running-or-runnable time is at most the exec's time (it is later by what the
    program itself slept or waited for the disk before ``seen``). A program forked and exec'd at once
    (the usual case: a shell's ``python train.py``, torchrun's ranks) has waited for no child, and
    keeps its exact ``/proc`` start whatever its imports waited for.
    """
    forked = process_start_time(pid)
    if seen is None:
        seen = (time.time(), runnable_seconds(pid), waited_for_children(pid))
    now, runnable, waited = seen
    if forked is None or runnable is None or not waited:
        return forked
    vouched = now - runnable
    return vouched if vouched - forked > EXEC_GAP_S else forked


def first_seen() -> tuple[float, float | None, bool] | None:
    """When ``traceml_otel`` was first imported in this process (:mod:`traceml_otel._first_seen`)."""
    from traceml_otel._first_seen import FIRST_SEEN

    return FIRST_SEEN


@dataclass(slots=True)
class _KindTotal:
    seconds: float = 0.0
    count: int = 0
    before_first_step_s: float = 0.0
    trailing_step: int = -1
    """The step count when the last block of this kind ended, and its time since that step."""
    trailing_s: float = 0.0


class TimeLedger:
    """Per-rank totals of ``outside_step`` time by kind, FLOPs, and the process's start and end."""

    def __init__(
        self, run_dir: Path | None, rank: int, run_id: str, steps: Callable[[], int], *,
        peak_flops: float | None = None, dtype: str = "bf16", min_interval_s: float = 1.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.run_id = run_id
        self._steps = steps
        self._anchor = wall_anchor_ns() / 1e9
        """Wall time at ``perf_counter() == 0``: every time in the record is this plus monotonic time."""
        self.process_start = own_start_time("self", first_seen())
        self.launcher_start: float | None = None
        """When the launcher that started this process started (torchrun's agent), when known."""
        self.restart = 0
        self.init_at = self.now()
        self._telemetry_from: float | None = None
        self.telemetry_s = 0.0
        """Telemetry's own time at the end: from :meth:`telemetry_began` to the final record."""
        self.min_interval_s = min_interval_s
        self._warn = warn
        self._kinds: dict[str, _KindTotal] = {}
        self._open: list[float] = []
        self._last_write = 0.0
        self._write_lock = threading.Lock()
        self._write_due = threading.Event()
        self._writer: threading.Thread | None = None
        self._ended = False
        """The final record is written: nothing is written after it."""
        self.write_errors = 0
        self.declared_sum: float | None = None
        self.declared_steps = 0
        self.per_sample: float | None = None
        self.per_token: float | None = None
        self.measured: float | None = None
        self.measured_step: int | None = None
        self.peak_flops = peak_flops
        self.dtype = dtype
        self.device_name = ""
        self.precision = ""
        """Reduced precision the program was seen training in (``capture/precision.py``), else empty."""
        self.models_checked = 0
        self.resumed_from: int | None = None
        self.earlier_progress = 0
        self.first_step = 0
        """A restarted attempt's first step number (the earlier attempts' steps)."""
        self.earlier_after_s = 0.0
        self.earlier_restart_starts: tuple[float, ...] = ()
        self.training_tid: int | None = None
        """The training thread's kernel id (:meth:`training_thread`), for the emitter's CPU samples."""

    def now(self) -> float:
        """Unix time on the monotonic clock (the anchor plus ``perf_counter``)."""
        return self._anchor + time.perf_counter()

    def telemetry_began(self) -> None:
        """Telemetry's own shutdown starts (the last hand-off, the final export, the linger): from here
        to the final record it is ``telemetry``, not the program's shutdown."""
        if self._telemetry_from is None:
            self._telemetry_from = time.perf_counter()

    # --- restarts -----------------------------------------------------------------------
    def carry_earlier_attempt(self) -> None:
        """A restarted attempt: keep how far the earlier attempts got (their record, about to be replaced)."""
        if self.run_dir is None:
            return
        try:
            earlier = read_time_record(Path(self.run_dir) / time_file_name(self.rank))
        except (OSError, ValueError):  # none yet (it died before init), or unreadable
            return
        if earlier.run_id and earlier.run_id != self.run_id:
            return
        reached = (earlier.resumed_from or 0) + earlier.steps - earlier.first_step
        self.earlier_progress = max(earlier.earlier_progress, reached)
        self.first_step = earlier.steps
        self.earlier_after_s = earlier.earlier_after_last_step_s
        starts = earlier.earlier_restart_starts
        if earlier.restart > 0 and earlier.process_start:  # every restart's gap stays countable
            starts = (*starts, earlier.process_start)
        self.earlier_restart_starts = starts[-MAX_ATTEMPTS:]
        for outside in earlier.outside:  # the earlier attempts' outside_step time stays in the account
            total = self._kinds.setdefault(outside.kind, _KindTotal())
            total.seconds += outside.seconds
            total.count += outside.count
            total.before_first_step_s += outside.before_first_step_s
            self.earlier_after_s += outside.after_last_step_s

    def training_thread(self, tid: int) -> None:
        """The first step ran on kernel thread ``tid``: written soon (by the writer thread), so the
        emitter can sample that thread's CPU counters from its own process."""
        self.training_tid = tid
        try:
            self.write_soon()
        except Exception as error:  # on the training thread's first step: never a reason to fail it
            self._count_failure(f"{type(error).__name__}: {error}")

    def resume_from(self, step: int) -> None:
        """This attempt resumed from a checkpoint taken after ``step`` completed steps; written at once."""
        self.resumed_from = step
        self.write()

    # --- outside_step -------------------------------------------------------------
    def enter_outside(self) -> None:
        """An ``outside_step`` block opens (nested blocks count in the outermost only)."""
        self._open.append(time.perf_counter())

    def exit_outside(self, kind: str, in_step: bool) -> None:
        """The innermost open block of ``kind`` ends; ``in_step``: it ran inside a step (not counted)."""
        if not self._open:
            return
        began = self._open.pop()
        if self._open or in_step:
            return
        seconds = max(0.0, time.perf_counter() - began)
        if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
            kind = "other"
        total = self._kinds.setdefault(kind, _KindTotal())
        total.seconds += seconds
        total.count += 1
        steps = self._steps()
        if steps == self.first_step:
            total.before_first_step_s += seconds
        if total.trailing_step == steps:
            total.trailing_s += seconds
        else:
            total.trailing_step, total.trailing_s = steps, seconds
        if seconds >= self.min_interval_s or time.perf_counter() - self._last_write >= self.min_interval_s:
            self.write_soon()  # a long block (an evaluation) is written at once: the live counters wait

    # --- FLOPs ------------------------------------------------------------------------
    def declare_step_flops(self, flops: float) -> None:
        """One step declared its FLOPs (``trace_step(flops=)``)."""
        self.declared_sum = (self.declared_sum or 0.0) + flops
        self.declared_steps += 1
        if self.declared_steps == 1:  # once: the emitter's live FLOPs counter reads it
            self.write_soon()

    def measured_flops(self, flops: float, step: int, device_name: str = "") -> None:
        """``FlopCounterMode`` counted ``flops`` in step ``step``; written at once (off this thread)."""
        self.measured, self.measured_step = float(flops), step
        self.device_name = device_name or self.device_name
        self.write_soon()

    # --- precision ----------------------------------------------------------------------
    def note_precision(self, precision: str) -> None:
        """The program trains in reduced precision (``autocast cuda bf16``, ``bf16 weights``); the
        first one seen is kept and written soon (off this thread)."""
        if precision and not self.precision:
            self.precision = precision
            self.write_soon()

    def model_seen(self, model: object) -> None:
        """A traced model: is it already in half precision? (The first few models only.)"""
        if self.precision or self.models_checked >= MAX_MODELS_CHECKED:
            return
        self.models_checked += 1
        self.note_precision(reduced_weights(model))

    # --- the record ---------------------------------------------------------------------
    def record(self, ended_at: float | None = None) -> TimeRecord:
        """The current ``rank-R.time.json`` content."""
        steps = self._steps()
        outside = tuple(
            OutsideTotal(kind, t.seconds, t.count, t.before_first_step_s,
                         t.trailing_s if t.trailing_step == steps and steps > self.first_step else 0.0)
            for kind, t in self._kinds.items()
        )
        flops = FlopsRecord(self.declared_sum, self.declared_steps, self.per_sample, self.per_token,
                            self.measured, self.measured_step, self.peak_flops, self.dtype, self.device_name)
        return TimeRecord(self.rank, self.run_id, self.process_start, self.init_at, self.now(), ended_at,
                          steps, outside, flops, restart=self.restart,
                          launcher_start=self.launcher_start, resumed_from=self.resumed_from,
                          earlier_progress=self.earlier_progress, first_step=self.first_step,
                          earlier_after_last_step_s=self.earlier_after_s, telemetry_s=self.telemetry_s,
                          earlier_restart_starts=self.earlier_restart_starts, precision=self.precision,
                          training_tid=self.training_tid)

    def start_writer(self) -> None:
        """Start the writer thread now (``init()``), so the first write during training only signals it."""
        if self.run_dir is not None and self._writer is None and not self._ended:
            writer = threading.Thread(target=self._write_when_due, name="traceml-time-record", daemon=True)
            self._writer = writer
            writer.start()

    def write_soon(self) -> None:
        """Have the writer thread write the record (started here if ``start_writer`` was not called)."""
        if self.run_dir is None or self._ended:
            return
        self._last_write = time.perf_counter()
        self._write_due.set()
        if self._writer is None:
            self.start_writer()

    def _write_when_due(self) -> None:
        while True:
            self._write_due.wait()
            self._write_due.clear()
            if self._ended:
                return
            try:
                self.write()
            except RuntimeError:  # the training thread added a kind while the record was read: again
                time.sleep(0.01)
                self._write_due.set()
            except Exception as error:  # no traceback from a telemetry thread: counted, said once
                self._count_failure(f"{type(error).__name__}: {error}")

    def write(self, ended: bool = False) -> None:
        """Write the record now (``ended``: with the end time, and the last write); a failure is
        counted, said once."""
        if self.run_dir is None:
            return
        self._last_write = time.perf_counter()
        try:
            with self._write_lock:  # the writer thread and the caller's
                if self._ended:
                    return
                if ended:
                    self._ended = True
                    self._write_due.set()  # the writer thread ends
                    if self._telemetry_from is not None:
                        self.telemetry_s = max(0.0, self._last_write - self._telemetry_from)
                write_time_record(self.run_dir, self.record(self.now() if ended else None))
        except OSError as error:
            self._count_failure(str(error.strerror or error))

    def _count_failure(self, reason: str) -> None:
        self.write_errors += 1
        if self.write_errors == 1 and self._warn is not None:
            self._warn(f"cannot write the time record in {self.run_dir}: {reason}; "
                       "the time accounting of this rank will be partial")
