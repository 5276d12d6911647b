"""The live time counters (``traceml.time`` by ``traceml.time.category``) and MFU inputs of one rank.

The emitter sees every step record, this rank's ``rank-R.time.json`` (re-read when it changed, at most
once a second: process start, ``outside_step`` totals per kind, FLOPs and the declared peak) and its
hang record's stall. From them :class:`LiveTimeAccount` counts each second of the rank once it knows
its category (``docs/goodput.md``, "On the metric paths"):

- ``startup``: from the process start (or its launcher's) to the first step's input fetch, less
  ``outside_step`` time and stalls there; counted at the first step; and the start-up steps (a
  ``torch.compile`` step 0), by the analyzer's rule (:mod:`traceml_otel.analyze.startup_steps`) on the
  rank's first steps: their input wait and blocks are held until the rule can tell (at least
  :data:`~traceml_otel.analyze.startup_steps.MIN_STEPS` steps and a leading run of slow steps that
  ended within its share), then counted as start-up or as steps;
- ``step.input_wait`` and ``step.block`` (the traced blocks: goodput's numerator), per step;
- ``between_steps``: each gap between two steps less its input wait and ``outside_step`` blocks;
- ``outside.<kind>``: ``outside_step`` time per kind (at most :data:`MAX_OUTSIDE_KINDS`, then
  ``outside.other``), counted when the block ended;
- ``stalled``: while the hang watchdog reports a stall, carved out of the next step's parts;
- ``redone_steps``: the steps of a restarted attempt that redo steps an earlier attempt had done
  (``traceml.resume_from(step)``), moved out of ``step.block`` and ``step.input_wait``;
- ``shutdown``: from the last step's end to telemetry's end, less ``outside_step`` time after it and
  any stall still hung at the end (a stall there that resolved is quiet work of the shutdown).

Counters only grow. Each reader reports a category at 0 the first time it sees it (:class:`FirstZero`),
so ``rate()`` sees a first evaluation or the start-up instead of a series that starts high.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from functools import reduce
from itertools import repeat
from operator import add
from pathlib import Path
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.step_run import RunMeasures, StepRun
from traceml_otel.step_records import StepRecord
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.hang_record import STATE_HUNG
from traceml_otel.wire.peak_flops import table_peak
from traceml_otel.wire.time_record import FlopsRecord, TimeRecord, read_time_record

POLL_S = 1.0
STALL_MARGIN_S = 2 * POLL_S
"""A live stall is counted this much behind, so a hang record read up to this stale never overcounts."""
HOLD_MAX_STEPS = 2000
"""The first steps are held for the start-up decision at most this many (then decided as they stand)."""
HOLD_S = 30.0
"""Or this long from the first step's fetch (slow steps: the counters do not wait 20 of them)."""
MAX_OUTSIDE_KINDS = 6
"""``outside_step`` kinds with their own series per rank; later kinds count as ``outside.other``."""
ALWAYS = (c.TIME_STARTUP, c.TIME_STEP_INPUT_WAIT, c.TIME_STEP_BLOCK, c.TIME_BETWEEN_STEPS, c.TIME_STALLED,
          c.TIME_SHUTDOWN)
"""Categories exported from the first export at 0 (the others appear when first counted)."""
_NS = 1e-9


class LiveTimeAccount:
    """One rank's seconds by category and model FLOPs so far; fed by the emitter, read by both paths."""

    def __init__(self, run_dir: Path | None = None, rank: int = 0, hang: object | None = None,
                 poll_s: float = POLL_S) -> None:
        """``hang``: the emitter's view of the hang record (its ``record`` attribute, emit/hang_events.py)."""
        self.path = None if run_dir is None else Path(run_dir) / c.time_file_name(rank)
        self.hang = hang
        self.poll_s = poll_s
        self.record: TimeRecord | None = None
        self._seen: tuple[int, int] | None = None
        self._next_poll = 0.0
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(ALWAYS, 0.0)
        self._first_begin: float | None = None
        self._last_end: float | None = None
        self._steps = 0
        self._stall_closed: tuple[float | None, float] = (None, 0.0)
        """(detection time, end) of a stall a later step showed over before its record said so."""
        self._stall_counted_until = 0.0
        """Stall time up to this Unix time is counted in ``stalled``."""
        self._ended = False
        self._held: list[tuple[float, float, float, float | None]] | None = []
        """(step time, input wait, block, model FLOPs) of the first steps while start-up is undecided
        (``None`` after): a start-up step is neither goodput nor MFU."""
        self.flops = 0.0
        self.flops_steps = 0

    # --- inputs -------------------------------------------------------------------------------
    def poll(self, force: bool = False) -> None:
        """Re-read the time record when it changed (at most every ``poll_s`` unless ``force``)."""
        now = time.monotonic()
        if self.path is None or (now < self._next_poll and not force):
            return
        self._next_poll = now + self.poll_s
        try:
            stat = os.stat(self.path, follow_symlinks=False)
            key = (stat.st_mtime_ns, stat.st_size)
            if key == self._seen:
                return
            record = read_time_record(self.path)
        except (OSError, RecordError, ValueError):
            return
        self._seen = key
        with self._lock:
            self.record = record

    def add_step(self, record: StepRecord) -> None:
        """Count one step: its input wait, block and the gap before it (less ``outside_step`` time)."""
        self.poll(force=self._first_begin is None)
        inside_ns, wait_ns, between_ns, block_ns = _parts_ns(record)
        inside, wait, block = inside_ns * _NS, wait_ns * _NS, block_ns * _NS
        start, end = record.start_ns * _NS, record.end_ns * _NS
        with self._lock:
            self._close_stall(end)
            gap_from = self._last_end
            if self._first_begin is None:
                self._first_begin = start - wait
                gap = [self._startup(start - wait), wait, 0.0]
                gap_from = None
            else:
                gap = [0.0, wait, between_ns * _NS]
            if self._stall_known():  # else nothing to carve (the common case: 2-3 µs a step saved)
                gap = _carve(gap, self._stall_in(gap_from, start))
                block = max(0.0, block - self._stall_in(start, end))
            self._steps += 1
            gap[1] += inside
            self._add(c.TIME_STARTUP, gap[0])
            self._add(c.TIME_BETWEEN_STEPS, gap[2])
            if self._steps <= self._redone_steps():  # redoes a step an earlier attempt had done
                self._add(c.TIME_REDONE_STEPS, gap[1] + block)
            elif self._held is not None:  # start-up or not is decided on the first steps together
                flops = None if self.record is None else _step_flops(
                    self.record.flops, record.step, record.tokens, record.samples)
                self._held.append(((wait_ns + inside_ns + block_ns) * _NS, gap[1], block, flops))
                self._last_end = max(self._last_end or 0.0, end)
                self._decide_startup()
                return
            else:
                self._add(c.TIME_STEP_INPUT_WAIT, gap[1])
                self._add(c.TIME_STEP_BLOCK, block)
            self._last_end = max(self._last_end or 0.0, end)
            self._count_flops(record)

    def add_steps(self, records: Sequence[StepRecord]) -> None:
        """Count a batch of steps: the same totals as :meth:`add_step` on each, summed in one pass when
        no step needs one at a time (the common case: no stall, not the first step, none redone)."""
        first = 0
        while first < len(records) and self._one_at_a_time():
            self.add_step(records[first])  # the first steps (start-up) and the redone ones, one at a time
            first += 1
        records = records[first:]
        if not records:
            return
        self.poll()
        if self._stall_known():  # a stall to carve out of the steps' parts
            for record in records:
                self.add_step(record)
            return
        wait = between = block = 0.0
        last_end = 0
        for record in records:
            inside, step_wait, step_between, step_block = _parts_ns(record)
            wait += step_wait + inside
            between += step_between
            block += step_block
            if record.end_ns > last_end:
                last_end = record.end_ns
        with self._lock:
            self._steps += len(records)
            self._add(c.TIME_STEP_INPUT_WAIT, wait * _NS)
            self._add(c.TIME_BETWEEN_STEPS, between * _NS)
            self._add(c.TIME_STEP_BLOCK, block * _NS)
            self._last_end = max(self._last_end or 0.0, last_end * _NS)
            if self.record is not None:
                for record in records:
                    self._count_flops(record)

    def add_run(self, run: StepRun, first: int, stop: int) -> None:
        """:meth:`add_steps` of ``run``'s steps ``first`` to ``stop``, from its columns when no step
        needs one at a time (else from its records)."""
        if self._one_at_a_time():
            self.add_steps(run.records()[first:stop])
            return
        self.poll()
        if self._stall_known():
            for record in run.records()[first:stop]:
                self.add_step(record)
            return
        measures, part = run.measures(), slice(first, stop)
        with self._lock:  # sums of ints: the floats add_steps adds up one step at a time
            self._steps += stop - first
            self._add(c.TIME_STEP_INPUT_WAIT, float(sum(measures.wait_ns[part])) * _NS)
            self._add(c.TIME_BETWEEN_STEPS, float(sum(measures.between_ns[part])) * _NS)
            self._add(c.TIME_STEP_BLOCK, float(sum(measures.block_ns[part])) * _NS)
            self._last_end = max(self._last_end or 0.0, max(0, *measures.end_ns[part]) * _NS)
            if self.record is not None:
                self._count_run_flops(measures, part)

    def end(self, at: float | None = None) -> None:
        """Telemetry shut down at ``at`` (Unix seconds, default now): the rest is ``shutdown``."""
        self.poll(force=True)
        at = time.time() if at is None else at
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self._decide_startup(final=True)
            if self._last_end is None:  # no step at all: the whole life is start-up
                self._add(c.TIME_STARTUP, max(0.0, self._startup(at) - self._stall_in(None, at)))
            else:
                after = sum(o.after_last_step_s for o in self.record.outside) if self.record else 0.0
                stalled = self._stall_after_last_step(self._last_end, at)
                self._add(c.TIME_SHUTDOWN, max(0.0, at - self._last_end - after - stalled))

    # --- outputs ------------------------------------------------------------------------------
    def totals(self) -> list[tuple[str, float]]:
        """(category, seconds) so far; ``outside.<kind>`` from the time record (bounded)."""
        self.poll()
        with self._lock:
            self._count_live_stall()
            totals = dict(self._seconds)
            record = self.record
        if record is not None:
            for index, outside in enumerate(record.outside):
                kind = outside.kind if index < MAX_OUTSIDE_KINDS else "other"
                name = f"{c.TIME_OUTSIDE_PREFIX}{kind}"
                totals[name] = totals.get(name, 0.0) + outside.seconds
        return list(totals.items())

    @property
    def ended(self) -> bool:
        return self._ended

    def peak_flops(self) -> float | None:
        """This rank's peak FLOP/s: ``TRACEML_PEAK_FLOPS``, else the table's for the measured device."""
        record = self.record
        if record is None:
            return None
        flops = record.flops
        peak = flops.peak_flops
        if peak is None:
            peak = table_peak(flops.device_name, flops.dtype)
        return peak if peak is not None and peak > 0 else None

    # --- internals (under the lock) -------------------------------------------------------------
    def _startup(self, until: float) -> float:
        """From the process's (or its launcher's) start to ``until``, less ``outside_step`` time there."""
        record = self.record
        if record is None:
            return 0.0
        starts = [t for t in (record.process_start, record.launcher_start) if t]
        if not starts:
            return 0.0
        before = sum(o.before_first_step_s for o in record.outside)
        return max(0.0, until - min(starts) - before)

    def _add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def _one_at_a_time(self) -> bool:
        """Whether the next step needs :meth:`add_step` (the first, a held one, a redone one)."""
        return self._first_begin is None or self._held is not None or self._steps < self._redone_steps()

    def _decide_startup(self, final: bool = False) -> None:
        """Count the held first steps once the analyzer's rule can tell which lead as start-up
        (:func:`~traceml_otel.analyze.startup_steps.startup_steps`): with enough steps, when the leading
        slow ones ended before the rule's share ran out (more steps could not make one more start-up);
        or when they have been held :data:`HOLD_S` (slow steps: the rule on the steps there are, at
        least 3) or :data:`HOLD_MAX_STEPS`; ``final`` (the end): now, by the analyzer's rule (fewer
        steps than it judges: none is start-up)."""
        held = self._held
        if held is None:
            return
        from traceml_otel.analyze.startup_steps import MAX_SHARE, MIN_STEPS, leading_slow, startup_steps

        times = [time for time, _, _, _ in held]
        if final or len(held) >= HOLD_MAX_STEPS:
            count = startup_steps(times)
        elif len(held) >= MIN_STEPS:
            count = startup_steps(times)
            if count >= int(len(held) * MAX_SHARE):
                return  # the leading slow steps fill the share: one more may still be start-up
        elif len(held) >= 3 and self._last_end is not None and self._first_begin is not None \
                and self._last_end - self._first_begin >= HOLD_S:
            count = leading_slow(times, max(1, int(len(held) * MAX_SHARE)))
        else:
            return
        self._held = None
        for index, (_, wait, block, flops) in enumerate(held):
            if index < count:
                self._add(c.TIME_STARTUP, wait + block)
                continue
            self._add(c.TIME_STEP_INPUT_WAIT, wait)
            self._add(c.TIME_STEP_BLOCK, block)
            if flops is not None:
                self.flops += flops
                self.flops_steps += 1

    def _stall_known(self) -> bool:
        """Whether the hang record names a stall (:meth:`_stall_interval` is ``None`` otherwise)."""
        record = getattr(self.hang, "record", None)
        return record is not None and record.stalled_s is not None and record.stalled_s > 0

    def _stall_interval(self, now: float) -> tuple[float, float] | None:
        """The hang record's stall: from the last progress to its resolution, or to ``now`` less
        :data:`STALL_MARGIN_S` while it lasts (the record read may be that stale)."""
        record = getattr(self.hang, "record", None)
        if record is None or record.stalled_s is None or record.stalled_s <= 0:
            return None
        since = record.written_at - record.stalled_s
        if record.resolved_at is not None:
            return since, record.resolved_at
        if record.detected_at == self._stall_closed[0]:
            return since, self._stall_closed[1]
        if record.state == STATE_HUNG:
            return since, now - STALL_MARGIN_S
        return None

    def _close_stall(self, progressed_at: float) -> None:
        """A step that ended at ``progressed_at`` shows progress: a stall the record still calls hung
        (its resolution not read yet) ended by then."""
        record = getattr(self.hang, "record", None)
        if (record is not None and record.state == STATE_HUNG and record.resolved_at is None
                and record.detected_at != self._stall_closed[0]
                and record.written_at - record.stalled_s < progressed_at):
            self._stall_closed = (record.detected_at, progressed_at)

    def _stall_in(self, begin: float | None, end: float) -> float:
        """Seconds of stall within [``begin``, ``end``] (``None``: since ever): counted as ``stalled``
        where not yet counted, and returned to be carved out of that interval's categories."""
        stall = self._stall_interval(time.time())
        if stall is None:
            return 0.0
        low, high = max(stall[0], begin if begin is not None else stall[0]), min(stall[1], end)
        if high <= low:
            return 0.0
        uncounted = max(0.0, high - max(low, self._stall_counted_until))
        self._add(c.TIME_STALLED, uncounted)
        self._stall_counted_until = max(self._stall_counted_until, high)
        return high - low

    def _stall_after_last_step(self, last_end: float, at: float) -> float:
        """At the end: the stall after the last step that counts as ``stalled``. The rank came out of a
        resolved one (quiet work after its last step: a final save, a slow exit), so what was not yet
        counted live is shutdown, as in the analyzer; a stall still hung counts to the end."""
        record = getattr(self.hang, "record", None)
        if record is None or record.resolved_at is None:
            return self._stall_in(last_end, at)
        since = record.written_at - record.stalled_s
        return max(0.0, min(self._stall_counted_until, at) - max(last_end, since))

    def _count_live_stall(self) -> None:
        """A stall after the last step, counted as it goes (the next step or the end carves it out).
        A resolved one waits for the next step (then it is stalled) or the end (then it is shutdown);
        after the end nothing more is counted (the endpoint's linger is no stall)."""
        record = getattr(self.hang, "record", None)
        if not self._ended and (record is None or record.resolved_at is None):
            self._stall_in(self._last_end, time.time())

    def _redone_steps(self) -> int:
        """How many of this attempt's first steps redo an earlier attempt's (0 when not resumed)."""
        record = self.record
        if record is None or record.resumed_from is None:
            return 0
        return max(0, record.earlier_progress - record.resumed_from)

    def _count_flops(self, step: StepRecord) -> None:
        """Add this step's model FLOPs when the program declared or measured them (docs/goodput.md)."""
        if self.record is not None:
            per_step = _step_flops(self.record.flops, step.step, step.tokens, step.samples)
            if per_step is not None:
                self.flops += per_step
                self.flops_steps += 1

    def _count_run_flops(self, measures: RunMeasures, part: slice) -> None:
        """:meth:`_count_flops` of each step of a run's part (the same floats, added in order)."""
        assert self.record is not None
        flops = self.record.flops
        values = [value for value in map(_step_flops, repeat(flops), measures.steps[part],
                                         measures.tokens[part], measures.samples[part])
                  if value is not None]
        self.flops = reduce(add, values, self.flops)
        self.flops_steps += len(values)


def _step_flops(flops: FlopsRecord, step: int, tokens: int | None, samples: int | None) -> float | None:
    """One step's model FLOPs by the time record's ``flops`` (declared, measured, per token or per
    sample); ``None`` when unknown, and for the measured step (counting slowed it: left out of MFU)."""
    if flops.measured_step is not None and step == flops.measured_step:
        return None
    if flops.declared_sum is not None and flops.declared_steps > 0:
        return flops.declared_sum / flops.declared_steps
    if flops.measured is not None:
        return flops.measured
    if flops.per_token is not None and tokens is not None:
        return flops.per_token * tokens
    if flops.per_sample is not None and samples is not None:
        return flops.per_sample * samples
    return None


def _parts_ns(record: StepRecord) -> tuple[int, int, int, int]:
    """One step's parts in ns: (input wait inside the block, the wait before it, the gap between steps
    less that wait, the block less its inside wait); the gap is 0 on a rank's first step."""
    inside = record.input_wait_in_step_ns or 0  # fetches inside the block: input wait
    wait = record.waited_ns - inside
    between = 0 if record.between_steps_ns is None else max(0, record.between_steps_ns - wait)
    return inside, wait, between, max(0, record.end_ns - record.start_ns - inside)


def _carve(parts: list[float], seconds: float) -> list[float]:
    """Take ``seconds`` of stall out of ``parts``, largest first (where the rank sat while stalled)."""
    parts = list(parts)
    for index in sorted(range(len(parts)), key=parts.__getitem__, reverse=True):
        if seconds <= 0:
            break
        cut = min(parts[index], seconds)
        parts[index] -= cut
        seconds -= cut
    return parts


class FirstZero:
    """Per reader (the OTLP export, the scrape): each category is reported at 0 the first time, then
    its value, so a counter that appears with a large value (start-up counted at the first step, a
    3-minute evaluation) is seen by ``rate()`` and ``increase()`` instead of starting high. The final
    export (``final``) reports every value."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def apply(self, totals: Iterable[tuple[str, float]], final: bool = False) -> list[tuple[str, float]]:
        with self._lock:
            out = [(name, value if final or name in self._seen else 0.0) for name, value in totals]
            self._seen.update(name for name, _ in out)
        return out


class TimeInstruments:
    """The time counter and the MFU inputs on both paths, read from one :class:`LiveTimeAccount`.

    OTLP: ``traceml.time`` (observable counter, s, by ``traceml.time.category``),
    ``traceml.model_flops`` (observable counter) and ``traceml.peak_flops`` (gauge, only when known).
    Prometheus: the same as ``traceml_time_seconds_total``, ``traceml_model_flops_total`` and
    ``traceml_peak_flops``. Each path has its own :class:`FirstZero`.
    """

    def __init__(self, account: LiveTimeAccount) -> None:
        self.account = account
        self._otlp_zero = FirstZero()
        self._scrape_zero = FirstZero()
        self._otlp_flops_zero = FirstZero()
        self._scrape_flops_zero = FirstZero()

    def _flops(self, zero: FirstZero) -> float:
        return zero.apply([("flops", self.account.flops)], final=self.account.ended)[0][1]

    def register_otlp(self, meter: Any, attributes: dict[str, Any]) -> None:
        """Create the OTLP instruments on ``meter`` with the rank's ``attributes``."""
        from opentelemetry.metrics import Observation

        def time_seconds(options: Any) -> list[Any]:
            totals = self._otlp_zero.apply(self.account.totals(), final=self.account.ended)
            return [Observation(value, {**attributes, c.ATTR_TIME_CATEGORY: name}) for name, value in totals]

        def model_flops(options: Any) -> list[Any]:
            if not self.account.flops_steps:
                return []
            return [Observation(self._flops(self._otlp_flops_zero), attributes)]

        def peak_flops(options: Any) -> list[Any]:
            peak = self.account.peak_flops()
            return [] if peak is None else [Observation(peak, attributes)]

        meter.create_observable_counter(c.METRIC_TIME, [time_seconds], unit="s",
                                        description="Wall time of this rank by category (docs/goodput.md)")
        meter.create_observable_counter(c.METRIC_MODEL_FLOPS, [model_flops], unit="{flop}",
                                        description="Model FLOPs of the steps whose FLOPs are known")
        meter.create_observable_gauge(c.METRIC_PEAK_FLOPS, [peak_flops],
                                      description="Peak FLOP/s of this rank's device, when known")

    def prometheus_families(self, keys: list[str], values: list[str]) -> list[Any]:
        """The scrape's families (``keys``/``values``: the rank's label names and values)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: list[Any] = []
        seconds = CounterMetricFamily("traceml_time_seconds", "Wall time of this rank by category",
                                      labels=[*keys, "traceml_time_category"])
        for name, value in self._scrape_zero.apply(self.account.totals(), final=self.account.ended):
            seconds.add_metric([*values, name], value)
        families.append(seconds)
        if self.account.flops_steps:
            flops = CounterMetricFamily("traceml_model_flops", "Model FLOPs of the steps whose FLOPs are "
                                        "known", labels=keys)
            flops.add_metric(values, self._flops(self._scrape_flops_zero))
            families.append(flops)
        peak = self.account.peak_flops()
        if peak is not None:
            gauge = GaugeMetricFamily("traceml_peak_flops", "Peak FLOP/s of this rank's device", labels=keys)
            gauge.add_metric(values, peak)
            families.append(gauge)
        return families
