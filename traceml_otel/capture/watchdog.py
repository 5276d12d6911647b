"""The per-rank hang watchdog: a thread that notices when training stops making progress.

It never touches the training thread. Every tick (at most 1 s) it reads the recorder's plain
attributes (step number, whether a step is open, ``outside_step`` blocks) and the collectives in
flight (:mod:`traceml_otel.capture.progress`). Progress is a step opening or closing. When none is
seen for the hang timeout, max(``TRACEML_HANG_TIMEOUT_S``, ``TRACEML_HANG_FACTOR`` x the longest of
the last 64 step intervals), it takes every thread's Python stack (``sys._current_frames()``),
writes ``rank-R.hang.json`` atomically into the run folder, says so once on stderr when no launcher
watches, and keeps the record fresh while the hang lasts. When steps move again it marks the record
``resolved`` and remembers the episode: a later hang's record lists the earlier ones (bounded, see
:func:`~traceml_otel.wire.hang_record.bounded_episodes`), so every stall is counted. Work inside
``outside_step`` (evaluation, a checkpoint) is never a hang. Neither is work between steps that no
``outside_step`` marks, up to :data:`BUSY_LIMIT` times the timeout: when no step came for half the
timeout, no step is open, no collective is in flight and the training thread spent at least
:data:`BUSY_SHARE` of that time on a CPU or waiting for one (:mod:`~traceml_otel.capture.thread_cpu`),
it is working (an unmarked evaluation); the rank keeps its ``outside`` marker meanwhile, so its peers
waiting in their next collective do not report a hang either.

A thread cannot run while C code holds the GIL. For that case the watchdog keeps
``faulthandler.dump_traceback_later`` armed, re-arming it each tick: if the watchdog itself does not
run for the timeout, the interpreter's C watchdog dumps every thread's stack into
``rank-R.hang-traceback.txt`` without the GIL. (A pure-Python loop is not that case: the interpreter
hands the GIL over every switch interval, 5 ms, and the watchdog runs as usual.)
"""

from __future__ import annotations

import collections
import faulthandler
import json
import linecache
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from time import perf_counter_ns
from types import FrameType
from typing import Any

from traceml_otel.capture.progress import CollectiveProgress
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.capture.thread_cpu import ThreadCpuClock
from traceml_otel.contract import hang_traceback_file_name, outside_marker_file_name
from traceml_otel.wire._json import write_atomically
from traceml_otel.wire.hang_record import (
    MAX_FRAMES,
    MAX_THREADS,
    SOURCE_WATCHDOG,
    STATE_HUNG,
    STATE_RESOLVED,
    HangRecord,
    OpenCollective,
    StackFrame,
    StallEpisode,
    ThreadStack,
    bounded_episodes,
    write_hang_record,
)

INTERVALS_KEPT = 64
BUSY_SHARE = 0.25
"""The training thread's share of a quiet spell between steps on a CPU or waiting for one from which it is
working, not stalled (a sleeping, blocked or waiting thread uses next to none; where only the on-CPU time
is readable, a loaded machine halves a busy one's)."""
BUSY_LIMIT = 10.0
"""Work between steps is reported as a hang all the same after this many times the timeout (a loop that
never comes back to training)."""
REFRESH_S = 5.0
"""While a hang lasts, the record is rewritten every max(this, half the timeout): its seconds and
stacks stay current, and 1,024 hung ranks write about 30 files a second at the default timeout."""
BEFORE_FIRST_STEP = "before first step"
"""The phase of a hang between ``init()`` and the first step (rendezvous, process-group init, model
build, checkpoint load), watched with its own timeout (``TRACEML_HANG_STARTUP_TIMEOUT_S``)."""

_LIBRARY_ROOTS: tuple[str, ...] = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("platstdlib", "")} if p
)


def _torch_root() -> str:
    torch = sys.modules.get("torch")
    file = getattr(torch, "__file__", None)
    return str(Path(file).resolve().parent) + os.sep if file else "\0"


_OWN_ROOT = str(Path(__file__).resolve().parents[1]) + os.sep


def is_library_file(file: str, torch_root: str) -> bool:
    """True for frames of torch, traceml-otel, the standard library or frozen modules (not the program's)."""
    if file.startswith("<"):
        return True
    try:
        resolved = str(Path(file).resolve())
    except (OSError, ValueError):
        return False
    return resolved.startswith((torch_root, _OWN_ROOT, *_LIBRARY_ROOTS))


def stack_of(frame: FrameType | None, limit: int = MAX_FRAMES) -> tuple[StackFrame, ...]:
    """A frame's stack, outermost first, at most ``limit`` innermost frames."""
    frames: list[StackFrame] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        line = frame.f_lineno or 0
        text = linecache.getline(code.co_filename, line).strip()
        frames.append(StackFrame(code.co_filename, line, code.co_name, text))
        frame = frame.f_back
    frames.reverse()
    return tuple(frames)


def classify(frames: tuple[StackFrame, ...], torch_root: str) -> str:
    """The phase a stack shows (innermost match wins): input, forward, backward, optimizer or ``""``."""
    for frame in reversed(frames):
        file = frame.file
        if not file.startswith(torch_root):
            try:
                if not str(Path(file).resolve()).startswith(torch_root):
                    continue
            except (OSError, ValueError):
                continue
        if "utils/data/" in file and frame.function in ("__next__", "_next_data", "_get_data"):
            return "input"
        if "/optim/" in file:
            return "optimizer"
        if frame.function == "backward" or "/autograd/" in file:
            return "backward"
        if file.endswith("nn/modules/module.py") and frame.function in ("_call_impl", "_wrapped_call_impl"):
            return "forward"
    return ""


def user_location(frames: tuple[StackFrame, ...], torch_root: str) -> StackFrame | None:
    """The innermost frame in the program's own code (not torch, traceml-otel or the standard library)."""
    for frame in reversed(frames):
        if not is_library_file(frame.file, torch_root):
            return frame
    return frames[-1] if frames else None


class HangWatchdog:
    """Watches one rank's progress from a daemon thread; see the module docstring."""

    def __init__(
        self,
        recorder: StepRecorder,
        progress: CollectiveProgress | None,
        *,
        rank: int,
        world_size: int,
        run_id: str,
        host: str,
        run_dir: Path | None,
        floor_s: float,
        factor: float,
        announce: bool,
        warn: Callable[[str], None],
        on_record: Callable[[HangRecord], None] | None = None,
        startup_timeout_s: float = 0.0,
    ) -> None:
        self.recorder = recorder
        self.progress = progress
        self.rank, self.world_size, self.run_id, self.host = rank, world_size, run_id, host
        self.run_dir = run_dir
        self.floor_s = floor_s
        self.factor = factor
        self.startup_timeout_s = startup_timeout_s
        """The timeout before the first step (from ``init()``); 0: not watched before it."""
        self.announce = announce
        self._warn = warn
        self.on_record = on_record
        self.tick_s = max(0.05, min(1.0, floor_s / 5))
        self.intervals: collections.deque[float] = collections.deque(maxlen=INTERVALS_KEPT)
        self.hang: HangRecord | None = None
        self.episodes: tuple[StallEpisode, ...] = ()
        """Earlier resolved stalls (the most recent), and how many (and seconds) were left out."""
        self.episodes_left_out, self.episodes_left_out_s = 0, 0.0
        self.records_written = 0
        self.flight_recorder_note = ""
        self._outside_since: float | None = None
        self._outside_marked = False
        self._thread_cpu = ThreadCpuClock()
        self._cpu_at_progress: float | None = None
        self.busy_between = False
        """The training thread is working between steps (no step for half the timeout or more)."""
        self.write_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traceml-hang-watchdog", daemon=True)
        self._traceback_file: Any = None

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the watchdog thread (and arm the faulthandler fallback when there is a run folder)."""
        if self.run_dir is not None:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                path = self.run_dir / hang_traceback_file_name(self.rank)
                self._traceback_file = open(path, "w", encoding="utf-8")
            except OSError:
                self._traceback_file = None
        self._thread.start()

    def stop(self, clean: bool = False) -> None:
        """Stop watching (shutdown): no record is written after this.

        ``clean``: the program is ending normally, so a hang still open (long work after the last
        step, not marked with ``outside_step``) ended with it and is marked ``resolved``; after a
        signal or an exception the record stays ``hung``.
        """
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)  # a report being written finishes first
        self._mark_outside(False)
        if clean and self.hang is not None:
            self._resolve()
        if self._traceback_file is not None:
            try:
                faulthandler.cancel_dump_traceback_later()
                empty = self._traceback_file.tell() == 0
                self._traceback_file.close()
                if empty and self.run_dir is not None:
                    (self.run_dir / hang_traceback_file_name(self.rank)).unlink(missing_ok=True)
            except (OSError, ValueError):
                pass
            self._traceback_file = None

    def timeout_s(self) -> float:
        """The hang timeout now: max(floor, factor x the longest recent step interval)."""
        longest = max(self.intervals, default=0.0)
        return max(self.floor_s, self.factor * longest)

    # --- the loop --------------------------------------------------------------------
    def _run(self) -> None:
        recorder = self.recorder
        beat = (recorder.step, recorder.in_step)
        armed = recorder.step > 0 or recorder.in_step
        last_ns = perf_counter_ns()
        last_refresh = 0.0
        while not self._stop.wait(self.tick_s):
            try:
                now_ns = perf_counter_ns()
                current = (recorder.step, recorder.in_step)
                self._mark_outside(bool(recorder.outside) or self.busy_between)
                if recorder.outside or current != beat:
                    worked, self.busy_between = self.busy_between, False  # work is no step interval
                    self._cpu_at_progress = self._thread_cpu.read(recorder.owner)
                    if current != beat and armed and not recorder.outside and not worked:
                        steps = max(1, current[0] - beat[0])
                        self.intervals.append((now_ns - last_ns) / 1e9 / steps)
                    armed = armed or current[1] or current[0] > 0
                    if self.hang is not None:
                        self._resolve(self._first_progress_ns(last_ns, now_ns) if current != beat else now_ns)
                    beat, last_ns = current, now_ns
                    started = recorder.step_started_ns()
                    if current[1] and now_ns - int(self.tick_s * 2e9) <= started <= now_ns:
                        last_ns = started  # a step opened since the last tick: progress was its start
                    self._clear_fallback_dump()
                    self._arm_fallback()
                    continue
                self._arm_fallback()
                if not armed and self.startup_timeout_s <= 0:
                    continue
                stalled = (now_ns - last_ns) / 1e9
                timeout = self.timeout_s() if armed else self.startup_timeout_s
                if self.hang is None and armed and stalled >= timeout / 2:
                    self.busy_between = stalled < BUSY_LIMIT * timeout and self._working(stalled)
                if stalled < timeout or self.busy_between:
                    continue
                if self.hang is None and self._peer_outside():
                    continue  # a peer's checkpoint or evaluation: the others wait for it, no hang
                if self.hang is None or time.monotonic() - last_refresh >= max(REFRESH_S, timeout / 2):
                    last_refresh = time.monotonic()
                    self._report(stalled, timeout)
            except Exception as error:  # the watchdog must never take training down
                self._warn(f"rank {self.rank}: hang watchdog stopped: {type(error).__name__}: {error}")
                return

    def _working(self, quiet_s: float) -> bool:
        """Whether the training thread, between steps with no collective in flight, spent at least
        :data:`BUSY_SHARE` of the last ``quiet_s`` seconds (since the last progress) on or waiting for a
        CPU."""
        recorder = self.recorder
        if recorder.in_step or (self.progress is not None and self.progress.snapshot()[1]):
            return False
        now = self._thread_cpu.read(recorder.owner)
        since = self._cpu_at_progress
        return now is not None and since is not None and quiet_s > 0 and (now - since) / quiet_s >= BUSY_SHARE

    def _mark_outside(self, outside: bool) -> None:
        """Keep ``rank-R.outside.json`` while this rank is in an ``outside_step`` block longer than half
        the floor, so peers waiting for it in a collective do not report a hang."""
        if self.run_dir is None:
            return
        if not outside:
            self._outside_since = None
            if self._outside_marked:
                self._outside_marked = False
                (self.run_dir / outside_marker_file_name(self.rank)).unlink(missing_ok=True)
            return
        now = time.monotonic()
        if self._outside_since is None:
            self._outside_since = now
        if not self._outside_marked and (self.busy_between or now - self._outside_since >= self.floor_s / 2):
            kind = self.recorder.outside[-1] if self.recorder.outside else "work between steps"
            text = json.dumps({"rank": self.rank, "kind": str(kind)[:80], "since": time.time()})
            try:
                write_atomically(self.run_dir / outside_marker_file_name(self.rank), text)
                self._outside_marked = True
            except OSError:
                pass

    def _peer_outside(self) -> bool:
        """Whether another rank of the run keeps an ``outside_step`` marker (same run folder only)."""
        if self.run_dir is None:
            return False
        own = outside_marker_file_name(self.rank)
        try:
            return any(name.endswith(".outside.json") and name != own for name in os.listdir(self.run_dir))
        except OSError:
            return False

    def _clear_fallback_dump(self) -> None:
        """Steps move again: a faulthandler dump of an earlier GIL hold is no hang any more."""
        handle = self._traceback_file
        if handle is not None and handle.tell() > 0:
            handle.seek(0)
            handle.truncate()

    def _arm_fallback(self) -> None:
        if self._traceback_file is not None and not self._stop.is_set():
            faulthandler.dump_traceback_later(self.timeout_s() + 2 * self.tick_s, repeat=False,
                                              file=self._traceback_file)

    # --- records ---------------------------------------------------------------------
    def snapshot(self, stalled_s: float, timeout_s: float) -> HangRecord:
        """This rank's progress state and every thread's stack, now."""
        recorder = self.recorder
        torch_root = _torch_root()
        main_id = threading.main_thread().ident
        names = {t.ident: t.name for t in threading.enumerate()}
        own = threading.get_ident()
        threads: list[ThreadStack] = []
        main_frames: tuple[StackFrame, ...] = ()
        for ident, frame in list(sys._current_frames().items()):
            if ident == own:
                continue
            frames = stack_of(frame)
            if ident == main_id:
                main_frames = frames
            threads.append(ThreadStack(names.get(ident, f"thread {ident}"), ident == main_id, frames))
        threads.sort(key=lambda t: not t.main)
        in_step = recorder.in_step
        done: list[str] = []
        for call in list(recorder.state.phases) if in_step else ():
            if call[0] not in done:
                done.append(call[0])
        entered, open_calls = self.progress.snapshot() if self.progress is not None else ({}, [])
        collective = None
        if open_calls:
            kind, group, seq, start_ns, source = open_calls[0]
            collective = OpenCollective(kind, group, seq, source, (perf_counter_ns() - start_ns) / 1e9)
        phase = "collective" if collective is not None else classify(main_frames, torch_root)
        if not phase:
            phase = "step" if in_step else BEFORE_FIRST_STEP if self._before_first_step() else "between steps"
        location = user_location(main_frames, torch_root)
        note = ""
        if phase == "input":
            workers = self._worker_stacks(torch_root)
            threads += workers[:MAX_THREADS]
            stuck = next(((t, f) for t in workers if t.main and (f := user_location(t.frames, torch_root))
                          and not is_library_file(f.file, torch_root)), None)
            if stuck is not None:
                location = stuck[1]
                note = f"in DataLoader worker {stuck[0].name.split(' Current', 1)[0].replace('child', 'pid')}"
        now = time.time()
        return HangRecord(
            rank=self.rank, world_size=self.world_size, run_id=self.run_id, state=STATE_HUNG,
            stalled_s=stalled_s, timeout_s=timeout_s, step=recorder.step, in_step=in_step, phase=phase,
            phases_done=tuple(done), collective=collective, entered=entered,
            location=location, innermost=main_frames[-1] if main_frames else None, note=note,
            threads=tuple(threads[:MAX_THREADS]), host=self.host, pid=os.getpid(),
            detected_at=self.hang.detected_at if self.hang is not None else now - stalled_s + timeout_s,
            written_at=now, source=SOURCE_WATCHDOG, earlier=self.episodes,
            earlier_left_out=self.episodes_left_out, earlier_left_out_s=self.episodes_left_out_s,
        )

    def _before_first_step(self) -> bool:
        return self.recorder.step == 0 and not self.recorder.in_step and not self.intervals

    def _worker_stacks(self, torch_root: str) -> list[ThreadStack]:
        """The DataLoader workers' stacks (this process's armed children), with their source lines."""
        from traceml_otel.capture.worker_stacks import child_stacks

        stacks = []
        for thread in child_stacks():
            frames = tuple(replace(f, code=linecache.getline(f.file, f.line).strip()) for f in thread.frames)
            stacks.append(replace(thread, frames=frames))
        return stacks

    def _report(self, stalled_s: float, timeout_s: float) -> None:
        first = self.hang is None
        record = self.snapshot(stalled_s, timeout_s)
        if not record.note and first and self._working(stalled_s):  # working past BUSY_LIMIT x the timeout
            record = replace(record, note=f"busy between steps for {stalled_s:.0f} s (on a CPU, no step, no "
                                          "collective): unmarked work that has not come back to training")
        if first and self.run_dir is not None:
            from traceml_otel.capture.flight_recorder import dump_flight_recorder

            said = dump_flight_recorder(self.run_dir, self.rank)
            if said:
                self.flight_recorder_note = said
        if self.flight_recorder_note:
            record = replace(record, flight_recorder=self.flight_recorder_note)
        self.hang = record
        self._write(record)
        if first and self.announce:
            where = record.location.where() if record.location is not None else "?"
            self._warn(f"rank {self.rank}: no progress for {stalled_s:.0f} s in step {record.step} "
                       f"({record.phase}) at {where}; stacks in {self._record_path()}")

    def _first_progress_ns(self, since_ns: int, now_ns: int) -> int:
        """When progress came back: the first step end or start after ``since_ns`` the recorder still
        shows (``now_ns`` when neither; a step that opened and closed within one tick shows only its end)."""
        recorder = self.recorder
        seen = [t for t in (recorder.last_step_end_ns, recorder.step_started_ns())
                if t is not None and since_ns < t <= now_ns]
        return min(seen, default=now_ns)

    def _resolve(self, progressed_ns: int | None = None) -> None:
        """The stall ended: at ``progressed_ns`` (``perf_counter_ns``; ``None``: now), not at the tick
        that noticed it, so the episode never takes the next step's time (up to a tick, 1 s by default)."""
        hang, self.hang = self.hang, None
        if hang is None:
            return
        now = time.time()
        if progressed_ns is not None:
            now -= max(0, perf_counter_ns() - progressed_ns) / 1e9
        # written_at - stalled_s stays the last progress (the time accounting and the hang span read it)
        stalled = max(0.0, now - (hang.written_at - hang.stalled_s))
        self._write(replace(hang, state=STATE_RESOLVED, resolved_at=now, written_at=now, stalled_s=stalled))
        where = hang.location.where() if hang.location is not None else ""
        episode = StallEpisode(now - stalled, stalled, hang.step, hang.in_step, hang.phase, where)
        self.episodes, self.episodes_left_out, self.episodes_left_out_s = bounded_episodes(
            (*self.episodes, episode), self.episodes_left_out, self.episodes_left_out_s)
        if self.announce:
            self._warn(f"rank {self.rank}: progress resumed (the hang was reported "
                       f"{now - hang.detected_at:.0f} s ago)")

    def _record_path(self) -> str:
        return str(self.run_dir) if self.run_dir is not None else "(no run folder)"

    def _write(self, record: HangRecord) -> None:
        if self.on_record is not None:
            try:
                self.on_record(record)
            except Exception:
                pass
        if self.run_dir is None:
            return
        try:
            write_hang_record(self.run_dir, record)
            self.records_written += 1
        except OSError as error:
            if self.write_failures == 0:
                self._warn(f"rank {self.rank}: cannot write its hang record "
                           f"({type(error).__name__}: {error})")
            self.write_failures += 1
