"""Step-memory diagnosis: pressure, imbalance across ranks, and creep over the window.

Peaks come from the step span (reset at step start, read at step end; CUDA only). Pressure uses
the reserved peak against the device total (what an out-of-memory error is measured against);
imbalance and creep use the allocated peak (what the rank's tensors actually hold), falling back
to reserved when allocated was not recorded.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.advice import MEMORY_PRESSURE_ADVICE
from traceml_otel.analyze.findings import Evidence, Finding, MemoryAnalysis, RankMemory
from traceml_otel.analyze.kinds import SEVERITY_ORDER, MemoryKind, Severity
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.window import StepWindow

GIB = float(1 << 30)


def _peak(step: StepTiming) -> int | None:
    return step.peak_allocated if step.peak_allocated is not None else step.peak_reserved


def rank_memory(rank: int, steps: Sequence[StepTiming]) -> RankMemory:
    """The highest per-step peaks of one rank."""
    allocated = [s.peak_allocated for s in steps if s.peak_allocated is not None]
    reserved = [s.peak_reserved for s in steps if s.peak_reserved is not None]
    totals = [s.memory_total for s in steps if s.memory_total is not None]
    return RankMemory(
        rank, max(allocated, default=None), max(reserved, default=None), max(totals, default=None)
    )


def diagnose_memory(window: StepWindow) -> MemoryAnalysis:
    """The memory section of one window."""
    ranks = tuple(rank_memory(r, steps) for r, steps in zip(window.ranks, window.per_rank, strict=True))
    worst, median = _peak_series(window)
    return memory_analysis(ranks, worst, median, window.steps)


def memory_analysis(
    ranks: Sequence[RankMemory], worst: Sequence[float], median: Sequence[float], steps: int
) -> MemoryAnalysis:
    """The memory section from per-rank peaks and the worst-rank and median-rank peak series over
    ``steps`` steps (one point per step from spans; per time bucket from metrics)."""
    ranks = tuple(ranks)
    if all(m.peak_allocated is None and m.peak_reserved is None for m in ranks):
        return MemoryAnalysis(MemoryKind.NO_GPU, (), ranks)
    if steps < t.MEMORY_MIN_STEPS:
        return MemoryAnalysis(MemoryKind.NOT_ENOUGH_STEPS, (), ranks)
    pressure = _pressure(ranks)
    imbalance = _imbalance(ranks)
    growth, rising = _creep(worst, median)
    findings = [
        f
        for f in (
            _pressure_finding(pressure),
            _imbalance_finding(imbalance, pressure),
            _creep_finding(growth, rising),
        )
        if f is not None
    ]
    findings.sort(key=lambda f: -SEVERITY_ORDER[f.severity])
    status = MemoryKind(findings[0].kind) if findings else MemoryKind.STABLE
    return MemoryAnalysis(status, tuple(findings), ranks, pressure, imbalance, growth)


def _pressure(ranks: Sequence[RankMemory]) -> float | None:
    ratios = [m.peak_reserved / m.total for m in ranks if m.peak_reserved is not None and m.total]
    return max(ratios, default=None)


def _imbalance(ranks: Sequence[RankMemory]) -> float | None:
    peaks = [m.peak_allocated if m.peak_allocated is not None else m.peak_reserved for m in ranks]
    values = [p for p in peaks if p is not None]
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return (max(values) - median) / median if median > 0 else None


def _band_mean(series: Sequence[float], low: float, high: float) -> float:
    n = len(series)
    start, stop = int(low * n), max(int(low * n) + 1, int(high * n))
    band = series[start:stop]
    return sum(band) / len(band)


def _peak_series(window: StepWindow) -> tuple[list[float], list[float]]:
    """Per step, the worst rank's and the median rank's peak (steps with any peak)."""
    worst: list[float] = []
    median: list[float] = []
    for index in range(window.steps):
        peaks = [_peak(steps[index]) for steps in window.per_rank]
        values = [p for p in peaks if p is not None]
        if values:
            worst.append(max(values))
            median.append(statistics.median(values))
    return worst, median


def _creep(worst: Sequence[float], median: Sequence[float]) -> tuple[int | None, bool]:
    """Growth (recent band minus baseline band) of the worst-rank series, and whether both rise."""
    if len(worst) < t.MEMORY_MIN_STEPS or len(median) < t.MEMORY_MIN_STEPS:
        return None, False
    bands = [[_band_mean(series, lo, hi) for lo, hi in t.CREEP_BANDS] for series in (worst, median)]
    rising = all(base < middle < recent for base, middle, recent in bands)
    return int(bands[0][2] - bands[0][0]), rising


def _pressure_finding(pressure: float | None) -> Finding | None:
    if pressure is None or pressure < t.PRESSURE_WARN:
        return None
    return Finding(
        kind=MemoryKind.HIGH_PRESSURE,
        severity=Severity.CRITICAL if pressure >= t.PRESSURE_CRITICAL else Severity.WARNING,
        score=pressure,
        title="GPU memory nearly full",
        why=f"The worst rank's reserved peak reaches {pressure:.0%} of device memory.",
        next=MEMORY_PRESSURE_ADVICE,
        evidence=(Evidence("pressure", pressure, "ratio"),),
    )


def _imbalance_finding(imbalance: float | None, pressure: float | None) -> Finding | None:
    if imbalance is None or pressure is None:
        return None
    if imbalance >= t.IMBALANCE_CRITICAL and pressure >= t.IMBALANCE_CRITICAL_PRESSURE:
        severity = Severity.CRITICAL
    elif imbalance >= t.IMBALANCE_WARN and pressure >= t.IMBALANCE_WARN_PRESSURE:
        severity = Severity.WARNING
    else:
        return None
    return Finding(
        kind=MemoryKind.IMBALANCE,
        severity=severity,
        score=imbalance,
        title="Uneven memory across ranks",
        why=f"The worst rank's peak is {imbalance:.0%} above the median rank's (pressure {pressure:.0%}).",
        next="Check what one rank holds more of: rank-0-only metrics or logging tensors, uneven batches, "
        "or unsharded parameters.",
        evidence=(Evidence("imbalance", imbalance, "ratio"), Evidence("pressure", pressure, "ratio")),
    )


def _creep_finding(growth: int | None, rising: bool) -> Finding | None:
    if growth is None or not rising:
        return None
    creep = growth >= t.CREEP_BYTES
    return Finding(
        kind=MemoryKind.MEMORY_CREEP if creep else MemoryKind.MEMORY_RISING,
        severity=Severity.WARNING if creep else Severity.INFO,
        score=growth / GIB,
        title="Memory creeps up" if creep else "Memory rising",
        why=f"Per-step peaks rise steadily over the window: +{growth / GIB:.2f} GiB from early to recent "
        "steps.",
        next="Look for tensors kept across steps: losses appended without .item() or .detach(), growing "
        "caches, or graphs held by stored outputs.",
        evidence=(Evidence("growth", growth, "By"),),
    )
