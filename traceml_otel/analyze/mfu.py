"""Model FLOPs utilisation per rank: achieved model FLOP/s over the device's peak (``docs/goodput.md``).

Achieved FLOP/s = a step's model FLOPs / its time (input wait + block, the wall clock), over every
step of the rank but the run's start-up steps (a compile step: :mod:`~traceml_otel.analyze.startup_steps`;
its time is start-up in the time account, not step time). The FLOPs come, first found first, from
``trace_step(flops=)`` (their mean per declaring step), a ``FlopCounterMode`` count of one whole
step (that step's time left out), or ``declare_flops(per_token=|per_sample=)`` times each step's
tokens or samples. All are per traced
block, so gradient accumulation (several micro-batches in one block) is counted in full. The peak
is ``TRACEML_PEAK_FLOPS`` or the table (:mod:`traceml_otel.wire.peak_flops`) for the device and
``TRACEML_MFU_DTYPE``; on CPU it must be declared. A value that is not a finite number in
(0, 100 %] is a data problem naming its inputs, never shown as a number.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.wire.peak_flops import PEAK_FLOPS, table_peak
from traceml_otel.wire.time_record import TimeRecord

__all__ = ["PEAK_FLOPS", "MfuAnalysis", "RankMfu", "analyze_mfu", "rank_mfu", "table_peak"]

@dataclass(frozen=True, slots=True)
class RankMfu:
    """One rank's MFU (``mfu`` is ``None`` when ``problem`` says why it cannot be shown)."""

    rank: int
    flops_per_s: float | None
    peak_flops: float | None
    mfu: float | None
    source: str
    """``declared``, ``measured``, ``per_token``, ``per_sample`` or ``none``."""
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class MfuAnalysis:
    """Every rank's MFU and the job's (sum of achieved over sum of peaks, valid ranks only)."""

    ranks: tuple[RankMfu, ...]
    mfu: float | None
    problems: tuple[str, ...] = ()


def _flops_and_time(steps: list[StepTiming], record: TimeRecord) -> tuple[float, float, str] | None:
    """Total model FLOPs, total step seconds and the FLOPs' source for one rank."""
    flops = record.flops

    def seconds(step: StepTiming) -> float:
        return (step.input_wait_cpu or 0.0) + (step.traced_cpu or 0.0)

    steps = [s for s in steps if s.step != flops.measured_step]  # counting slowed that step down
    if flops.declared_sum is not None and flops.declared_steps > 0:
        total = sum(seconds(s) for s in steps)
        return flops.declared_sum / flops.declared_steps * len(steps), total, "declared"
    if flops.measured is not None:
        return flops.measured * len(steps), sum(seconds(s) for s in steps), "measured"
    by_work = ((flops.per_token, "tokens", "per_token"), (flops.per_sample, "samples", "per_sample"))
    for per, attribute, name in by_work:
        if per is None:
            continue
        counted = [s for s in steps if getattr(s, attribute) is not None]
        if counted:
            return per * sum(getattr(s, attribute) for s in counted), sum(seconds(s) for s in counted), name
    return None


def rank_mfu(rank: int, steps: list[StepTiming], record: TimeRecord | None) -> RankMfu | None:
    """One rank's MFU, or ``None`` when the program declared no FLOPs at all (MFU not asked for)."""
    if record is None:
        return None
    found = _flops_and_time(steps, record)
    if found is None:
        return None
    total, seconds, source = found
    peak = record.flops.peak_flops
    device = record.flops.device_name or "cpu"
    if peak is None:
        peak = table_peak(device, record.flops.dtype)
    achieved = total / seconds if seconds > 0 else None
    inputs = (f"{total:.3g} FLOPs ({source}) over {seconds:.3g} s of steps, peak "
              f"{'unknown' if peak is None else f'{peak:.3g} FLOP/s'} ({device}, {record.flops.dtype})")
    if peak is None:
        return RankMfu(rank, achieved, None, None, source,
                       f"rank {rank}: MFU needs the peak FLOP/s of '{device[:60]}' ({record.flops.dtype}), "
                       "which is not in the table: set TRACEML_PEAK_FLOPS")
    if achieved is None or not math.isfinite(achieved) or not math.isfinite(peak) or peak <= 0:
        return RankMfu(rank, achieved, peak, None, source,
                       f"rank {rank}: MFU cannot be computed from {inputs}")
    mfu = achieved / peak
    if mfu <= 0 or mfu > 1:
        return RankMfu(rank, achieved, peak, None, source,
                       f"rank {rank}: MFU would be {'above 100 %' if mfu > 1 else 'zero or negative'} from "
                       f"{inputs}: check flops= (per rank, per whole step) and TRACEML_PEAK_FLOPS")
    return RankMfu(rank, achieved, peak, mfu, source)


def analyze_mfu(steps: Iterable[StepTiming], records: Mapping[int, TimeRecord],
                startup_through: int | None = None) -> MfuAnalysis | None:
    """MFU of every rank that declared or measured FLOPs; ``None`` when none did. ``startup_through``:
    the last of the run's start-up steps, left out."""
    by_rank: dict[int, list[StepTiming]] = defaultdict(list)
    for step in steps:
        if startup_through is None or step.step > startup_through:
            by_rank[step.rank].append(step)
    ranks = [r for r in (rank_mfu(rank, by_rank.get(rank, []), records.get(rank)) for rank in sorted(records))
             if r is not None]
    if not ranks:
        return None
    valid = [r for r in ranks if r.mfu is not None]
    achieved = sum(r.flops_per_s or 0.0 for r in valid)
    peak = sum(r.peak_flops or 0.0 for r in valid)
    problems = tuple(r.problem for r in ranks if r.problem)[:10]
    return MfuAnalysis(tuple(ranks), achieved / peak if valid and peak > 0 else None, problems)
