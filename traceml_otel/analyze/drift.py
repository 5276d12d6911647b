"""Beyond the per-window verdict: step-time drift over the run, the slowest steps, chart series.

Drift: per aligned step, the median over ranks of the step time. The baseline is the typical
(median of normal) step time early in the run, after skipping the first few steps; the recent
level is the same over the last steps. "Normal" leaves out spikes more than 3 scaled MADs from the
median (checkpoints, evaluation). The onset is where the run is best split into an early and a
late level (see :func:`_onset`).
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import DriftAnalysis, RankSeries, WorstStep
from traceml_otel.analyze.kinds import Clock, DriftKind
from traceml_otel.analyze.metrics import StepValues, step_values
from traceml_otel.analyze.records import StepTiming
from traceml_otel.analyze.window import StepWindow

MAX_POINTS = 400
"""Points per rank kept for the step-time chart."""


def typical(values: Sequence[float]) -> float:
    """Median of the values within 3 scaled median absolute deviations of the median."""
    median = statistics.median(values)
    spread = 1.4826 * statistics.median(abs(v - median) for v in values)
    if spread <= 0:
        return median
    return statistics.median(v for v in values if abs(v - median) <= 3 * spread)


def step_series(
    step_numbers: Sequence[int], per_rank: Sequence[Sequence[float | None]]
) -> tuple[list[int], list[float]]:
    """Step numbers and the median-over-ranks step time of each aligned step that has one."""
    steps: list[int] = []
    series: list[float] = []
    for number, column in zip(step_numbers, zip(*per_rank, strict=True), strict=True):
        known = [v for v in column if v is not None]
        if known:
            steps.append(number)
            series.append(known[0] if len(known) == 1 else statistics.median(known))
    return steps, series


def detect_drift(steps: Sequence[int], series: Sequence[float]) -> DriftAnalysis:
    """Compare the early baseline with the recent level; find where the recent level began."""
    n = len(series)
    if n < t.DRIFT_MIN_STEPS:
        return DriftAnalysis(DriftKind.NOT_ENOUGH_STEPS)
    band = max(t.DRIFT_MIN_BAND, int(n * t.DRIFT_BAND))
    skip = max(1, int(n * t.DRIFT_SKIP))
    base_lo, base_hi = skip, min(n, skip + band)
    recent_lo = max(base_hi, n - band)
    if recent_lo >= n:
        return DriftAnalysis(DriftKind.NOT_ENOUGH_STEPS)
    baseline = typical(series[base_lo:base_hi])
    recent = typical(series[recent_lo:])
    change = recent / baseline - 1.0 if baseline > 0 else 0.0
    kind = DriftKind.STABLE
    since = None
    if abs(change) >= t.DRIFT_CHANGE:
        kind = DriftKind.SLOWING if change > 0 else DriftKind.SPEEDING_UP
        since = steps[_onset(series, skip)]
    return DriftAnalysis(
        kind=kind,
        baseline_s=baseline,
        recent_s=recent,
        change=change,
        since_step=since,
        baseline_steps=(steps[base_lo], steps[base_hi - 1]),
        recent_steps=(steps[recent_lo], steps[-1]),
    )


def _onset(series: Sequence[float], first: int) -> int:
    """Index where the series steps from its early level to its late level.

    The split that best fits the series from ``first`` on as two flat levels (least squares, by
    prefix sums); values are clipped to their 5th-95th percentiles first so single spikes do not
    pull the split. A sharp change gives its exact step, a gradual one its middle.
    """
    tail = sorted(series[first:])
    low, high = tail[int(0.05 * (len(tail) - 1))], tail[int(0.95 * (len(tail) - 1))]
    values = [min(high, max(low, v)) for v in series[first:]]
    n = len(values)
    total = sum(values)
    total_sq = sum(v * v for v in values)
    best, best_cost = 1, float("inf")
    head = head_sq = 0.0
    for k in range(1, n):
        head += values[k - 1]
        head_sq += values[k - 1] ** 2
        rest, rest_sq = total - head, total_sq - head_sq
        cost = (head_sq - head * head / k) + (rest_sq - rest * rest / (n - k))
        if cost < best_cost:
            best, best_cost = k, cost
    return first + best


def _dominant(value: StepValues) -> tuple[str, float | None]:
    parts = {
        "input_wait": value.input_wait,
        "h2d": value.h2d,
        "forward": value.forward,
        "backward": value.backward,
        "optimizer": value.optimizer,
        "communication": value.communication,
        "residual": value.residual,
    }
    known = [(v, name) for name, v in parts.items() if v is not None]
    if not known:
        return "unknown", None
    seconds, name = max(known)
    return name, seconds


def worst_steps(
    window: StepWindow, seconds: Sequence[Sequence[float | None]], clock: Clock, count: int = t.WORST_STEPS
) -> tuple[WorstStep, ...]:
    """The ``count`` slowest (rank, step) records of the window, slowest first, with their trace ids."""
    candidates = (
        (value, r, i)
        for r, column in enumerate(seconds)
        for i, value in enumerate(column)
        if value is not None
    )
    out = []
    for value, r, i in heapq.nlargest(count, candidates):
        parts = step_values(window.per_rank[r][i], clock)
        name, part = _dominant(parts)
        out.append(WorstStep(parts.step, parts.rank, value, parts.trace_id, name, part))
    return tuple(out)


def rank_series(rank: int, steps: Sequence[StepTiming], seconds: Sequence[float | None]) -> RankSeries:
    """One rank's step time and memory peak per step, averaged into at most MAX_POINTS buckets."""
    size = max(1, -(-len(steps) // MAX_POINTS))
    numbers: list[int] = []
    times: list[float] = []
    memory: list[int | None] = []
    for start in range(0, len(steps), size):
        known = [v for v in seconds[start : start + size] if v is not None]
        if not known:
            continue
        bucket = steps[start : start + size]
        numbers.append(bucket[0].step)
        times.append(sum(known) / len(known))
        peaks = [s.peak_reserved for s in bucket if s.peak_reserved is not None]
        memory.append(max(peaks) if peaks else None)
    return RankSeries(rank, tuple(numbers), tuple(times), tuple(memory))
