"""The rank's live window in its emitter: the last steps' table lines, summarized about once a second.

The emitter already turns every step into a line of the step table (``rank-R.steps.csv``). The window
keeps references to the last :data:`~traceml_otel.wire.live_record.WINDOW_STEPS` of those lines (a
deque append per batch: nothing on the training thread, next to nothing here). Once a second,
:meth:`LiveWindow.maybe_publish` parses the lines it has not parsed yet (at most a window's worth),
measures the window with the analyzer's own :func:`~traceml_otel.analyze.measures.rank_metrics` (one
definition of input wait, residual, exposed communication, ...; the analyzer is imported at the first
summary, about 0.2 s of the emitter's time once, not at its start-up) and rewrites ``rank-R.live.json``
(:mod:`traceml_otel.wire.live_record`). It also writes when no step came, so a reader can tell a quiet
rank (its record still ages forward, its trainer's state says why) from a silent one (its record stops).
"""

from __future__ import annotations

import csv
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from operator import itemgetter, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_otel.contract import time_file_name
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.live_record import (
    MAX_LIST,
    TRAINER_GONE,
    TRAINER_RUNNING,
    TRAINER_STOPPED,
    TRAINER_UNKNOWN,
    WINDOW_STEPS,
    LiveHang,
    LiveRecord,
    OutsideKind,
    write_live_record,
)
from traceml_otel.wire.step_schema import SLOT
from traceml_otel.wire.step_table import COLUMN_TYPES
from traceml_otel.wire.time_record import TimeRecord, read_time_record

if TYPE_CHECKING:
    from traceml_otel.analyze.run_model import StepTiming

PUBLISH_S = 1.0
"""How often the record is rewritten."""
WINDOW_FIELDS = ("steps", "step_time", "input_wait", "traced", "forward", "backward", "optimizer", "h2d",
                 "compute", "residual", "samples_per_step", "tokens_per_step", "communication",
                 "communication_total", "communication_waiting", "communication_transfer", "between_steps",
                 "optimizer_updates", "micro_steps", "h2d_measured", "communication_measured")
"""The ``RankMetrics`` fields a live record carries (the viewer rebuilds ``RankMetrics`` from them)."""

_CONVERT: dict[str, Callable[[str], object]] = {
    "BIGINT": int, "DOUBLE": float, "VARCHAR": str, "BOOLEAN": lambda text: text == "True"}
_TYPES = tuple(_CONVERT[kind] for _, kind in COLUMN_TYPES)
_STARTS, _ENDS = itemgetter(SLOT["start_ns"]), itemgetter(SLOT["end_ns"])
FIRST_STEPS = 20
"""The first steps whose blocks are kept apart until the start-up rule tells (as the time counters)."""


def parse_table_line(line: str) -> StepTiming | None:
    """One step-table CSV line as a :class:`StepTiming` (``None``: not a full row)."""
    from traceml_otel.analyze.sources.step_table import step_timing  # the analyzer: imported at first use

    try:
        fields = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None
    if len(fields) != len(_TYPES):
        return None
    try:
        values = [None if text == "" else kind(text) for kind, text in zip(_TYPES, fields, strict=True)]
        return step_timing(values)
    except (ValueError, TypeError):
        return None


def _block_ns(row: Any) -> int | None:
    try:
        return int(_ENDS(row) - _STARTS(row))
    except (TypeError, IndexError, KeyError, ValueError):
        return None


def trainer_state(pid: int) -> str:
    """``running``, ``stopped`` (SIGSTOP, a debugger), ``gone`` or ``unknown`` (no ``/proc``)."""
    if pid <= 0:
        return TRAINER_UNKNOWN
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read(512)
    except FileNotFoundError:
        return TRAINER_GONE
    except OSError:
        return TRAINER_UNKNOWN
    state = text[text.rfind(b")") + 2:][:1]
    if state in (b"T", b"t"):
        return TRAINER_STOPPED
    return TRAINER_GONE if state in (b"Z", b"X", b"x") else TRAINER_RUNNING


def start_live_window(emitter: Any, run_dir: Path | None, hello: Hello) -> LiveWindow | None:
    """The emitter's live window (``None``: no run folder, or ``TRACEML_LIVE=off``); it reads the
    emitter's drop counts, disabled outputs and hang record when it summarizes."""
    if run_dir is None or not live_records_enabled():
        return None
    watch = emitter.hang_watch
    stats = emitter.stats
    return LiveWindow(run_dir, hello.run_id, hello.rank, local_rank=hello.local_rank,
                      world_size=hello.world_size, host=hello.host, trainer_pid=hello.pid,
                      dropped=lambda: emitter._dropped_spans() + stats.capture_dropped_steps,
                      degraded=lambda: [f"{k}: {v}" for k, v in stats.outputs_disabled.items()],
                      hang=lambda: watch.state.record if watch is not None else None, warn=emitter.warn)


def live_records_enabled() -> bool:
    """False when ``TRACEML_LIVE=off``: no live view, so the rank writes no live record either."""
    from traceml_otel.errors import SettingsError
    from traceml_otel.settings import live_mode

    try:
        return live_mode() != "off"
    except SettingsError:
        return True


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class LiveWindow:
    """The last steps of one rank and its ``rank-R.live.json`` (see the module docstring)."""

    def __init__(self, run_dir: Path, run_id: str, rank: int, *, local_rank: int, world_size: int, host: str,
                 trainer_pid: int, dropped: Callable[[], int], degraded: Callable[[], list[str]],
                 hang: Callable[[], HangRecord | None], warn: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.base = LiveRecord(run_id=run_id, rank=rank, seq=0, written_at=0.0, local_rank=local_rank,
                               world_size=world_size, host=host, trainer_pid=trainer_pid)
        self._dropped, self._degraded, self._hang, self._warn = dropped, degraded, hang, warn
        self._lines: deque[str] = deque(maxlen=WINDOW_STEPS)
        self._parsed: deque[StepTiming] = deque(maxlen=WINDOW_STEPS)
        self._unparsed = 0
        self.steps = 0
        self._block_ns = 0
        """Every traced block so far (ns), the first steps' apart (:meth:`count_blocks`)."""
        self._first_blocks_ns: list[int] = []
        self.seq = 0
        self._next_at = 0.0
        self._time: TimeRecord | None = None
        self._time_seen: tuple[int, int] | None = None
        self._last_step_at: float | None = None
        self.failed = False

    def add(self, chunks: list[str], steps: int) -> None:
        """A batch of step-table lines (chunks of one or more lines each)."""
        if not steps:
            return
        self.steps += steps
        self._last_step_at = time.time()
        for chunk in chunks[-WINDOW_STEPS:]:
            self._lines.extend(chunk.splitlines())
        self._unparsed = min(WINDOW_STEPS, self._unparsed + steps)

    def count_blocks(self, rows: list[Any]) -> None:
        """Add a batch's traced blocks (wire rows) to the running goodput: a column sum, once per batch
        (the first :data:`FIRST_STEPS` are kept one by one for the start-up rule)."""
        try:
            blocks = list(map(sub, map(_ENDS, rows), map(_STARTS, rows)))
        except (TypeError, IndexError, KeyError):  # a malformed row (the encoder counts it rejected)
            blocks = [b for row in rows if isinstance(b := _block_ns(row), int)]
        room = FIRST_STEPS - len(self._first_blocks_ns)
        if room > 0:
            self._first_blocks_ns += blocks[:room]
            blocks = blocks[room:]
        self._block_ns += sum(blocks)

    def maybe_publish(self, force: bool = False) -> None:
        """Rewrite the record when a second has passed (or ``force``)."""
        now = time.monotonic()
        if self.failed or (not force and now < self._next_at):
            return
        self._next_at = now + PUBLISH_S
        self.publish()

    def publish(self, ended: bool = False, end_status: str = "") -> None:
        """Summarize the window and rewrite the record now (a write failure turns the live record off)."""
        try:
            record = self.summary(ended, end_status)
            write_live_record(self.run_dir, record)
        except OSError as error:
            self.failed = True
            self._warn(f"live record turned off: {type(error).__name__}: {error}")

    def _window_steps(self) -> list[StepTiming]:
        if self._unparsed:
            lines = list(self._lines)[-self._unparsed:]
            self._unparsed = 0
            for line in lines:
                timing = parse_table_line(line)
                if timing is not None:
                    self._parsed.append(timing)
        return [s for s in self._parsed if s.error is None]

    def summary(self, ended: bool = False, end_status: str = "") -> LiveRecord:
        """The record as of now."""
        self.seq += 1
        steps = self._window_steps()
        from traceml_otel.analyze.kinds import Clock  # imported here: the emitter starts without the analyzer
        from traceml_otel.analyze.measures import rank_metrics
        from traceml_otel.analyze.stalls import rank_candidates
        from traceml_otel.analyze.startup_steps import startup_steps, step_time

        if self.steps <= WINDOW_STEPS:  # the window still starts at the run's first step: as the analyzer,
            steps = steps[startup_steps([step_time(s) for s in steps]):]  # start-up steps are no verdict
        stalled = {stall.step for stall in rank_candidates(self.base.rank, steps)}
        if stalled:  # as the analyzer: a stall is an event, never a slow step (nor, resolved, a straggler)
            steps = [s for s in steps if s.step not in stalled]
        clock = Clock.GPU if steps and all(s.has_gpu_timing() for s in steps) else Clock.CPU
        fields: dict[str, object] = {}
        if steps:
            metrics, seconds = rank_metrics(self.base.rank, steps, clock)
            known = sorted(s for s in seconds if s is not None)
            if known:
                fields.update(step_median_s=statistics.median(known), step_p95_s=_percentile(known, 0.95),
                              step_min_s=known[0], step_max_s=known[-1])
            span_s = (steps[-1].start_unix_nano - steps[0].start_unix_nano) * 1e-9
            if len(steps) > 1 and span_s > 0:
                fields["steps_per_s"] = (len(steps) - 1) / span_s
            fields["window"] = {name: _number(getattr(metrics, name)) for name in WINDOW_FIELDS}
            fields["mfu"] = self._mfu(metrics.step_time)
            last = steps[-1]
            fields.update(cuda_peak_bytes=max(s.peak_allocated or 0 for s in steps) or None,
                          cuda_reserved_bytes=max(s.peak_reserved or 0 for s in steps) or None,
                          cuda_total_bytes=last.memory_total, parallelism=last.parallelism,
                          last_step=last.step)
        time_record = self._time_record()
        outside = tuple(OutsideKind(o.kind, o.seconds, o.count) for o in time_record.outside[:MAX_LIST]
                        ) if time_record else ()
        started = time_record.process_start if time_record else None
        return LiveRecord(
            **{**_base_fields(self.base), **fields},
            seq=self.seq, written_at=time.time(), trainer_state=trainer_state(self.base.trainer_pid),
            ended=ended, end_status=end_status, steps=self.steps, last_step_at=self._last_step_at,
            started_at=started, window_steps=len(steps), clock=clock.value,
            goodput=self._goodput(started), outside=outside,
            dropped=self._dropped(), degraded=tuple(self._degraded()[:MAX_LIST]), hang=self._hang_state(),
        )

    def _goodput(self, started: float | None) -> float | None:
        """Goodput so far: every traced block (the time account's ``step.block``) over the wall time since
        the process started, less the start-up steps by the analyzer's rule (a compile step; on
        fewer than :data:`FIRST_STEPS` steps, step 0 when it is 10x their median; ``None`` before 3
        steps). ``traceml analyze`` accounts
        every second at the end; here time not yet placed (an open step, the gap after the last)
        counts as not in a step."""
        first = self._first_blocks_ns
        elapsed = time.time() - started if started is not None else 0.0
        if len(first) < 3 or elapsed <= 0:
            return None
        from traceml_otel.analyze.startup_steps import leading_slow, startup_steps

        startup = startup_steps(first) if len(first) >= FIRST_STEPS else leading_slow(first, 1)
        productive = self._block_ns + sum(first[startup:])
        return min(1.0, max(0.0, productive * 1e-9 / elapsed))

    def _mfu(self, step_time: float | None) -> float | None:
        flops = self._time.flops if self._time else None
        if flops is None or not flops.peak_flops or not step_time:
            return None
        per_step = flops.declared_sum / flops.declared_steps if flops.declared_sum and flops.declared_steps \
            else flops.measured
        return per_step / step_time / flops.peak_flops if per_step else None

    def _time_record(self) -> TimeRecord | None:
        """The rank's ``rank-R.time.json`` (re-read only when it changed)."""
        path = self.run_dir / time_file_name(self.base.rank)
        try:
            stat = os.stat(path, follow_symlinks=False)
        except OSError:
            return self._time
        key = (stat.st_mtime_ns, stat.st_size)
        if key != self._time_seen:
            self._time_seen = key
            try:
                self._time = read_time_record(path)
            except (RecordError, ValueError, OSError):
                pass
        return self._time

    def _hang_state(self) -> LiveHang:
        record = self._hang()
        if record is None:
            return LiveHang()
        location = record.location
        call = record.collective
        return LiveHang(
            state=record.state, stalled_s=record.stalled_s, phase=record.phase,
            location=f"{location.file}:{location.line}" if location is not None else "",
            code=(location.code or "") if location is not None else "",
            collective=f"{call.kind} #{call.seq} ({call.group})" if call is not None else "")


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None  # booleans as 1.0 / 0.0


def _base_fields(base: LiveRecord) -> dict[str, object]:
    return {"run_id": base.run_id, "rank": base.rank, "local_rank": base.local_rank,
            "world_size": base.world_size, "host": base.host, "trainer_pid": base.trainer_pid}


__all__ = ["TRAINER_RUNNING", "TRAINER_STOPPED", "LiveWindow", "parse_table_line", "trainer_state"]
