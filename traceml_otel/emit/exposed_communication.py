"""How much of each collective the step waited for (its *exposed* time), worked out per step.

Runs in the emitter, on the records the capture side measured; nothing is estimated.

- A blocking ``torch.distributed`` call held its caller for the whole call: all of it is exposed.
- An ``async_op=True`` call overlaps whatever the program did until it waited: its exposed part is
  not known (``None``).
- DDP's gradient buckets overlap backward. Once the last bucket of a backward call is handed over,
  there is no gradient left to compute and backward only waits for the buckets to complete. So the
  exposed time of one backward call's buckets is ``(last completion) - (last hand-over)`` (at least
  0), split across the buckets that complete after the last hand-over. The same formula holds on the
  GPU clock with the buckets' CUDA events (start = the bucket's gradients are ready on the compute
  stream, end = the collective completed).

Each collective is also placed in the phase call (forward, backward, optimizer) whose CPU interval
contains its start, so the analyzer can take exposed communication out of that phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from traceml_otel.step_records import CollectiveTiming, PhaseTiming, StepRecord

_PHASES_WITH_COMMUNICATION = ("forward", "backward", "optimizer")


@dataclass(frozen=True, slots=True)
class CollectiveExposure:
    """One collective of a step with its measured exposed time on each clock and its phase call."""

    timing: CollectiveTiming
    phase: PhaseTiming | None
    exposed_ns: int | None
    exposed_gpu_ns: int | None

    @property
    def duration_ns(self) -> int | None:
        end = self.timing.end_ns
        return None if end is None else end - self.timing.start_ns


def _containing_phase(collective: CollectiveTiming, phases: Sequence[PhaseTiming]) -> PhaseTiming | None:
    start = collective.start_ns
    for phase in phases:
        if phase.phase in _PHASES_WITH_COMMUNICATION and phase.start_ns <= start < phase.end_ns:
            return phase
    return None


def _cpu_interval(c: CollectiveTiming) -> tuple[int, int | None]:
    return c.start_ns, c.end_ns


def _gpu_interval(c: CollectiveTiming) -> tuple[int | None, int | None]:
    if c.gpu_offset_ns is None or c.gpu_duration_ns is None:
        return c.gpu_offset_ns, None
    return c.gpu_offset_ns, c.gpu_offset_ns + c.gpu_duration_ns


def overlapped_tail(intervals: Sequence[tuple[int | None, int | None]]) -> list[int] | None:
    """Per interval, its share of ``max(end) - max(start)``: the time after the last one started.

    ``None`` when any start or end is unknown (nothing is guessed).
    """
    if any(start is None or end is None for start, end in intervals):
        return None
    last_start = max(start for start, _ in intervals)  # type: ignore[type-var]
    shares = [0] * len(intervals)
    reached = last_start
    for index in sorted(range(len(intervals)), key=lambda i: intervals[i][1]):  # type: ignore[arg-type, return-value]
        end = intervals[index][1]
        assert end is not None
        if end > reached:
            shares[index] = end - reached
            reached = end
    return shares


def step_exposures(record: StepRecord) -> list[CollectiveExposure]:
    """Every collective of ``record`` with its exposed time (``None`` where it cannot be measured)."""
    if not record.collectives:
        return []
    phases = record.phases
    placed = [(c, _containing_phase(c, phases)) for c in record.collectives]
    exposed: dict[int, tuple[int | None, int | None]] = {}
    buckets: dict[int, list[int]] = {}  # DDP buckets grouped by their backward call (id of the phase)
    for index, (c, phase) in enumerate(placed):
        if c.source == "ddp":
            buckets.setdefault(id(phase), []).append(index)
        elif c.blocking:
            duration = None if c.end_ns is None else c.end_ns - c.start_ns
            exposed[index] = (duration, c.gpu_duration_ns)
        else:
            exposed[index] = (None, None)
    for members in buckets.values():
        cpu = overlapped_tail([_cpu_interval(placed[i][0]) for i in members])
        gpu = overlapped_tail([_gpu_interval(placed[i][0]) for i in members])
        for position, index in enumerate(members):
            exposed[index] = (None if cpu is None else cpu[position], None if gpu is None else gpu[position])
    return [
        CollectiveExposure(c, phase, exposed[index][0], exposed[index][1])
        for index, (c, phase) in enumerate(placed)
    ]


@dataclass(frozen=True, slots=True)
class WaitEntries:
    """A step's collective entries and the work before each (see :func:`wait_entries`)."""

    entries: list[int]
    work: list[int]
    last_exit_ns: int
    """When the rank left the step's last collective: the next step's work is counted from here."""


def wait_entries(
    record: StepRecord, exposures: Sequence[CollectiveExposure], limit: int, previous_exit_ns: int | None
) -> WaitEntries | None:
    """When the step could begin waiting in each collective, and how long it worked before.

    Entries (spans' clock, in order): a blocking call's start; a backward call's DDP buckets at
    their last hand-over (before it, backward still computes). ``async_op`` calls have no known wait:
    no entry. The work before an entry is the time since the rank left its previous collective
    (``previous_exit_ns`` for the step's first: the last one of an earlier step; without one, since
    it asked the loader for this step's batch), so a rank that arrives late because it worked
    longer (computing, loading, evaluating between steps) is told from one that only left the
    previous collective late. ``None`` when there is no entry, more than ``limit``, or a call whose
    end is unknown.
    """
    waits: list[tuple[int, int | None]] = []  # (entry, exit)
    ddp: dict[int, list[CollectiveTiming]] = {}
    for exposure in exposures:
        timing = exposure.timing
        if timing.source == "ddp":
            ddp.setdefault(id(exposure.phase), []).append(timing)
        elif timing.blocking:
            waits.append((timing.start_ns, timing.end_ns))
    for buckets in ddp.values():
        ends = [b.end_ns for b in buckets]
        waits.append((max(b.start_ns for b in buckets), None if None in ends else max(ends)))  # type: ignore[type-var]
    if not waits or len(waits) > limit:
        return None
    waits.sort(key=lambda w: w[0])
    entries, work = [], []
    previous = previous_exit_ns
    if previous is None:
        previous = record.start_ns - (record.input_wait_ns or 0)
    for entry, exit_ns in waits:
        if exit_ns is None:
            return None
        entries.append(entry)
        work.append(max(0, entry - previous))
        previous = max(previous, exit_ns)
    return WaitEntries(entries, work, previous)


def total(values: Sequence[int | None]) -> int | None:
    """Sum, or ``None`` if any value is unknown (missing is not zero)."""
    if None in values:  # (ints and None: no value equals None but None)
        return None
    return sum(values)  # type: ignore[arg-type]
