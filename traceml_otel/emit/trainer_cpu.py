"""The training thread's on-CPU time and CPU wait, sampled from the emitter's process.

``traceml compare`` tells a busier machine from slower code with these samples: when the wall time
per sample moved but the time the training thread itself needed (wall minus the time it waited,
runnable, for a CPU) did not, the machine was busier.

The samples are read from outside the training process on purpose. A thread of the training process
that wakes every 0.1 s must take the GIL from a training thread that lets it go at every torch call:
each wake-up cost 2-4 ms of CPU in that process (``benchmarks/overhead_pairs.py --otlp --tasks``, 0.4
ms steps: 11-27 us a step for the sampler, and more on the training thread). The emitter reads the
same kernel counters of the trainer's thread from ``/proc/<pid>/task/<tid>/schedstat`` (on-CPU ns,
run-queue wait ns) without touching that process. The thread id comes from the rank's time record
(``training_tid``, written once the first step ran); where ``schedstat`` is missing (a kernel without
``CONFIG_SCHEDSTATS``) it reads ``utime + stime`` from ``/proc/<pid>/task/<tid>/stat`` (clock ticks, no
wait); without ``/proc`` nothing is recorded and compare says so. Each sample also holds the
trainer's process CPU (``/proc/<pid>/stat``) and the machine's busy CPU time (``/proc/stat``): what
the other processes ran beside the training thread, which slows even its on-CPU time; and, about once a
second (:data:`CHILDREN_EVERY_S`), the on-CPU and CPU-wait time of the trainer's descendant processes
but the emitter (its DataLoader workers, also under a ``forkserver``: :func:`read_children_cpu`),
which tells the analysis whether the workers computed (or wanted a CPU) or waited on reads.

A sample's step count is the steps that had ended by its time, worked out from the step rows as they
arrive (both sides read ``CLOCK_MONOTONIC``); a sample waits for the rows that cover it, at most
:data:`RESOLVE_AFTER_S`. At the end, the samples after the last step's end are dropped: they measure the
trainer's shutdown, which would read as the last steps' CPU time. The samples are cumulative counters,
so thinning them loses resolution, never time: at :data:`MAX_SAMPLES` every other one is dropped and the
interval doubles (bounded for a run of any length). ``rank-R.cpu.json``
(:mod:`traceml_otel.wire.cpu_record`) is written atomically every :data:`WRITE_EVERY_S` and at the end.
A failure turns the sampling off for the run, said once.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from traceml_otel.contract import time_file_name
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.cpu_record import CpuRecord, cpu_file_name, write_cpu_record
from traceml_otel.wire.time_record import read_time_record

INTERVAL_S = 0.1
"""Time between two samples at the start (doubles each time the samples are thinned)."""
MAX_SAMPLES = 2048
WRITE_EVERY_S = 10.0
CHILDREN_EVERY_S = 1.0
"""The children's CPU (DataLoader workers) is read at most this often; the samples between hold -1."""
MAX_THREADS = 1024
MAX_CHILDREN = 256
"""Threads of one process whose children are listed, and processes read, per reading (bounded)."""
RESOLVE_AFTER_S = 2.0
"""A sample no step row has covered for this long takes the steps seen so far (the trainer flushes
its rows at least every 250 ms while steps end: a longer silence is a pause, not a late row)."""
_END = 2  # a step row's end (perf_counter ns), :class:`~traceml_otel.wire.step_row.StepRow`'s layout


def read_thread_cpu(pid: int | str, tid: int) -> tuple[str, int, int] | None:
    """(source, on-CPU ns, run-queue wait ns or -1) of thread ``tid`` of process ``pid``; ``None``
    without ``/proc`` or when the thread is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as stat:
            fields = stat.read().split()
        return "schedstat", int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        pass
    ticks = _ticks(f"/proc/{pid}/task/{tid}/stat")
    return None if ticks is None else ("stat", ticks, -1)


def read_process_cpu(pid: int | str) -> int:
    """CPU ns (user + system, clock-tick resolution) of process ``pid`` so far; -1 without ``/proc``."""
    ticks = _ticks(f"/proc/{pid}/stat")
    return -1 if ticks is None else ticks


def _ticks(path: str) -> int | None:
    try:
        with open(path, "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def read_children_cpu(pid: int | str, exclude: int) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) of process ``pid``'s descendants but ``exclude`` (the emitter)
    and its own: the live ones (listed in ``/proc/PID/task/TID/children`` of each thread, and theirs
    in turn: a ``forkserver`` start method makes the DataLoader workers children of its server process)
    with their CPU time (``/proc/CHILD/stat``, every thread) and their main thread's wait
    (``schedstat``), and the ones each of them reaped (``cutime + cstime``, on-CPU only: their wait is
    gone with them). ``None`` where the kernel does not list children (no ``CONFIG_PROC_CHILDREN``) or
    ``pid`` is gone. The wait tells a worker that wanted a CPU (a busy machine) from one that slept."""
    try:
        on_cpu, _, children = _stat_and_children(pid)
    except (OSError, ValueError, IndexError):
        return None
    wait = 0
    seen = {int(pid), exclude}
    frontier = [child for child in children if child not in seen]
    while frontier and len(seen) < MAX_CHILDREN:
        child = frontier.pop()
        if child in seen:
            continue
        seen.add(child)
        try:
            reaped, own, grandchildren = _stat_and_children(child)
        except (OSError, ValueError, IndexError):
            continue  # gone since listed: counted once its parent reaps it
        reading = read_thread_cpu(child, child)
        on_cpu += reaped + own
        wait += max(0, reading[2]) if reading is not None else 0
        frontier += [grandchild for grandchild in grandchildren if grandchild not in seen]
    return max(0, on_cpu), wait


def _stat_and_children(pid: int | str) -> tuple[int, int, list[int]]:
    """From one read of ``/proc/PID/stat``: the CPU ns of ``pid``'s reaped children (``cutime + cstime``)
    and its own (``utime + stime``, every thread); then its live children's pids."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    reaped = (int(fields[13]) + int(fields[14])) * 1_000_000_000 // tick  # fields 16, 17
    own = (int(fields[11]) + int(fields[12])) * 1_000_000_000 // tick  # fields 14, 15
    children: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task")[:MAX_THREADS]:
        with open(f"/proc/{pid}/task/{tid}/children", "rb") as listed:
            children += [int(child) for child in listed.read().split()]
    return reaped, own, children


def read_machine_busy() -> int:
    """CPU time (ns) all CPUs of the machine spent busy since boot, from ``/proc/stat``; -1 without it."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))  # user nice system irq softirq steal
        return busy * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1


class TrainerCpuSampler:
    """Samples one training thread's CPU counters against its step count, from the emitter's loop."""

    def __init__(self, run_dir: Path | None, rank: int, run_id: str, pid: int, warn: Callable[[str], None],
                 interval_s: float = INTERVAL_S, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._path = None if run_dir is None else Path(run_dir) / cpu_file_name(rank)
        self._time_path = None if run_dir is None else Path(run_dir) / time_file_name(rank)
        self._rank, self._run_id, self.pid = rank, run_id, pid
        self._warn = warn
        self._clock = clock
        self.interval_s = interval_s
        self.tid: int | None = None
        self.samples: list[tuple[int, int, int, int, int, int, int, int]] = []
        self._pending: deque[tuple[int, int, int, int, int, int, int]] = deque()
        """Read, waiting for their step count: (monotonic ns, on-CPU, wait, process CPU, machine busy,
        children's on-CPU, children's CPU wait)."""
        self._children_read = -(10**18)
        """When the children's CPU was last read (every :data:`CHILDREN_EVERY_S`; -1 in the samples
        between)."""
        self.source = ""
        self.thinned = 0
        self.steps_closed = 0
        self._last_end_ns = 0
        self._next_ns = 0
        self._last_write_ns = clock()
        self.off = False

    # --- inputs -----------------------------------------------------------------------------------
    def steps(self, rows: Sequence[Any]) -> None:
        """A batch of step rows, in order: the samples they cover get their step counts."""
        if not rows:
            return
        try:
            if self._pending:
                ends = [row[_END] for row in rows]
                while self._pending and self._pending[0][0] <= ends[-1]:
                    sample = self._pending.popleft()
                    self._keep(self.steps_closed + bisect_right(ends, sample[0]), sample)
            self._last_end_ns = max(self._last_end_ns, rows[-1][_END])
        except (TypeError, IndexError):
            pass  # a malformed row: its step still counts
        self.steps_closed += len(rows)

    def due_in(self) -> float:
        """Seconds until the next sample is due (the emitter's idle wait is no longer)."""
        return 3600.0 if self.off else max(0.0, (self._next_ns - self._clock()) / 1e9)

    def tick(self) -> None:
        """Take a sample when one is due, and write the record every :data:`WRITE_EVERY_S`."""
        now = self._clock()
        if self.off or now < self._next_ns:
            return
        self._next_ns = now + int(self.interval_s * 1e9)
        try:
            self.sample(now)
            if now - self._last_write_ns >= WRITE_EVERY_S * 1e9:
                self._last_write_ns = now
                self.write()
        except Exception as error:  # never a reason to disturb the emitter
            self.off = True
            self._warn(f"CPU sampling is off for this run: {type(error).__name__}: {error}")

    def sample(self, now: int | None = None) -> None:
        """Read the counters once (nothing before the training thread is known)."""
        now = self._clock() if now is None else now
        tid = self._thread()
        if tid is None:
            return
        reading = read_thread_cpu(self.pid, tid)
        if reading is None:  # not a thread of the trainer (an earlier attempt's record), or it ended
            self.tid = None  # the record is read again
            return
        self.source = reading[0]
        children: tuple[int, int] | None = None
        if now - self._children_read >= CHILDREN_EVERY_S * 1e9:
            self._children_read, children = now, read_children_cpu(self.pid, os.getpid())
        self._pending.append((now, reading[1], reading[2], read_process_cpu(self.pid), read_machine_busy(),
                              *(children or (-1, -1))))
        while self._pending and (self._pending[0][0] <= self._last_end_ns
                                 or now - self._pending[0][0] >= RESOLVE_AFTER_S * 1e9):
            sample = self._pending.popleft()  # covered by rows already seen, or no step since
            self._keep(self.steps_closed, sample)

    def close(self) -> None:
        """The end of the stream: the samples up to the last step's end take the steps seen, the later
        ones are dropped (they measure the trainer's shutdown, no step); the record is written."""
        if self.off:
            return
        while self._pending and self._pending[0][0] <= self._last_end_ns:
            self._keep(self.steps_closed, self._pending.popleft())
        self._pending.clear()
        self.write()

    # --- outputs ----------------------------------------------------------------------------------
    def record(self) -> CpuRecord:
        """The samples so far as the rank file's record."""
        return CpuRecord(self._run_id, self._rank, self.source, tuple(self.samples), self.thinned,
                         os.cpu_count() or 0)

    def write(self) -> None:
        """Write ``rank-R.cpu.json`` (atomically); a failure turns the sampling off, said once."""
        if self._path is None or self.off or not self.samples:
            return
        try:
            write_cpu_record(self._path, self.record())
        except OSError as error:
            self.off = True
            self._warn(f"CPU samples not written ({type(error).__name__}: {error}); compare cannot tell "
                       "a busier machine from slower code for this run")

    # --- internals --------------------------------------------------------------------------------
    def _keep(self, steps: int, sample: tuple[int, int, int, int, int, int, int]) -> None:
        self.samples.append((steps, *sample))
        if len(self.samples) >= MAX_SAMPLES:
            kept = self.samples[::2]
            if kept[-1] is not self.samples[-1]:
                kept.append(self.samples[-1])
            self.samples = kept
            self.interval_s *= 2
            self.thinned += 1

    def _thread(self) -> int | None:
        """The training thread's id, from the time record, read at each sample until it names one (a
        rewrite within one file-time tick, of the same size, would hide a change from ``stat``)."""
        if self.tid is not None or self._time_path is None:
            return self.tid
        try:
            self.tid = read_time_record(self._time_path).training_tid
        except (OSError, RecordError, ValueError):
            pass
        return self.tid
