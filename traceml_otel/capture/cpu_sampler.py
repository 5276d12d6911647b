"""The training thread's on-CPU time and CPU wait, sampled off the training thread.

``traceml compare`` tells a busier machine from slower code with these samples: when the wall time
per sample moved but the time the training thread itself needed (wall minus the time it waited,
runnable, for a CPU) did not, the machine was busier. The training thread does nothing for this: a
daemon thread (``traceml-cpu-sampler``) wakes every :data:`INTERVAL_S`, reads the recorder's step
count (a plain attribute) and the training thread's counters from ``/proc/self/task/<tid>/schedstat``
(on-CPU ns, run-queue wait ns), and keeps them as cumulative samples. Where ``schedstat`` is missing
(a kernel without ``CONFIG_SCHEDSTATS``) it reads ``utime + stime`` from ``/proc/self/task/<tid>/stat``
(clock ticks, no wait); without ``/proc`` nothing is recorded and compare says so. Each sample also
holds the machine's busy CPU time (``/proc/stat``): what the other processes ran beside the training
thread, which slows even its on-CPU time (shared caches, a hyper-thread sibling).

The samples are cumulative counters, so thinning them loses resolution, never time: at
:data:`MAX_SAMPLES` every other one is dropped and the interval doubles (bounded for a run of any
length). ``rank-R.cpu.json`` (:mod:`traceml_otel.wire.cpu_record`) is written atomically every
:data:`WRITE_EVERY_S` by the sampler thread and once more at shutdown. A failure turns the sampler
off for the run, said once; it never reaches training.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceml_otel.wire.cpu_record import CpuRecord, cpu_file_name, write_cpu_record

INTERVAL_S = 0.1
"""Time between two samples at the start (doubles each time the samples are thinned)."""
MAX_SAMPLES = 2048
WRITE_EVERY_S = 10.0


def read_thread_cpu(tid: int) -> tuple[str, int, int] | None:
    """(source, on-CPU ns, run-queue wait ns or -1) of thread ``tid`` of this process; ``None``
    without ``/proc``."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as stat:
            fields = stat.read().split()
        return "schedstat", int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return "stat", ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK"), -1
    except (OSError, ValueError, IndexError):
        return None


def read_machine_busy() -> int:
    """CPU time (ns) all CPUs of the machine spent busy since boot, from ``/proc/stat``; -1 without it."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))  # user nice system irq softirq steal
        return busy * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1


class CpuSampler:
    """Samples the training thread's CPU counters against the step count, on its own thread."""

    def __init__(self, recorder: Any, run_dir: Path | None, rank: int, run_id: str,
                 warn: Callable[[str], None], interval_s: float = INTERVAL_S) -> None:
        self._recorder = recorder
        self._path = None if run_dir is None else Path(run_dir) / cpu_file_name(rank)
        self._rank = rank
        self._run_id = run_id
        self._warn = warn
        self.interval_s = interval_s
        self.samples: list[tuple[int, int, int, int, int, int]] = []
        self.source = ""
        self.thinned = 0
        self._tid: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._off = False

    def start(self) -> None:
        """Start the sampler thread."""
        self._thread = threading.Thread(target=self._run, name="traceml-cpu-sampler", daemon=True)
        self._thread.start()

    def _training_tid(self) -> int | None:
        owner = self._recorder.owner
        if owner is None:
            return None
        if self._tid is None:
            thread = threading._active.get(owner)  # type: ignore[attr-defined]  # no call on the training thread
            self._tid = getattr(thread, "native_id", None)
        return self._tid

    def sample(self) -> None:
        """Take one sample (a no-op before the first step opened)."""
        tid = self._training_tid()
        if tid is None:
            return
        reading = read_thread_cpu(tid)
        if reading is None:
            return
        source, on_cpu, wait = reading
        row = (int(self._recorder.step), time.perf_counter_ns(), on_cpu, wait, time.process_time_ns(),
               read_machine_busy())
        with self._lock:
            self.source = source
            self.samples.append(row)
            if len(self.samples) >= MAX_SAMPLES:
                kept = self.samples[::2]
                if kept[-1] is not row:
                    kept.append(row)
                self.samples = kept
                self.interval_s *= 2
                self.thinned += 1

    def record(self) -> CpuRecord:
        """The samples so far as the rank file's record."""
        with self._lock:
            return CpuRecord(self._run_id, self._rank, self.source, tuple(self.samples), self.thinned,
                             os.cpu_count() or 0)

    def write(self) -> None:
        """Write ``rank-R.cpu.json`` (atomically); a failure turns the sampler off, said once."""
        if self._path is None or self._off:
            return
        record = self.record()
        if not record.samples:
            return
        try:
            write_cpu_record(self._path, record)
        except OSError as error:
            self._off = True
            self._warn(f"CPU samples not written ({type(error).__name__}: {error}); compare cannot tell "
                       "a busier machine from slower code for this run")

    def _run(self) -> None:
        last_write = time.monotonic()
        try:
            while not self._stop.wait(self.interval_s) and not self._off:
                self.sample()
                if time.monotonic() - last_write >= WRITE_EVERY_S:
                    self.write()
                    last_write = time.monotonic()
        except Exception as error:  # never a reason to disturb training
            self._off = True
            self._warn(f"CPU sampling is off for this run: {type(error).__name__}: {error}")

    def stop(self) -> None:
        """Take a last sample and write the record (bounded: waits at most 1 s for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        if not self._off:
            try:
                self.sample()
            except Exception:
                pass
            self.write()
