"""Beyond the per-window verdict: step-time drift over the run, the slowest steps, chart series.

Drift: per aligned step, the median over ranks of the step time. Warm-up steps are skipped; the
baseline is the typical (median of normal) step time of the next band of steps, the recent level
the same over the last band. "Normal" leaves out spikes more than 3 scaled MADs from the median
(checkpoints, evaluation). A change counts only when it is large (10 %), beyond the noise of the
two bands (4 standard errors of the difference of their medians) and held over the whole recent
band (both of its halves moved the same way). Every number is in :mod:`~traceml_otel.analyze.thresholds`
(``DRIFT_*``). The onset is where the run is best split into an
early and a late level (see :func:`_onset`). The method and its minimum are in docs/analyzer.md.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from itertools import groupby, pairwise
from operator import itemgetter

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import DriftAnalysis, RankSeries, WorstStep
from traceml_otel.analyze.kinds import Clock, DriftKind
from traceml_otel.analyze.measures import StepValues, step_values
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.window import StepWindow

MAX_POINTS = 400
"""Points per rank kept for the step-time chart."""
MAD_TO_SD = 1.4826
"""A median absolute deviation times this is a robust standard deviation (Gaussian noise)."""


def typical(values: Sequence[float]) -> float:
    """Median of the values within ``DRIFT_SPIKE_MADS`` (3) scaled median absolute deviations of the
    median."""
    median = statistics.median(values)
    spread = _spread(values)
    if spread <= 0:
        return median
    return statistics.median(v for v in values if abs(v - median) <= t.DRIFT_SPIKE_MADS * spread)


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


def _spread(values: Sequence[float]) -> float:
    """The scaled median absolute deviation (a robust standard deviation)."""
    median = statistics.median(values)
    return MAD_TO_SD * statistics.median(abs(v - median) for v in values)


def _median_error(values: Sequence[float]) -> float:
    """Standard error of the median of ``values``, from their robust spread."""
    return 1.2533 * _spread(values) / len(values) ** 0.5


def warmup_steps(series: Sequence[float]) -> int:
    """How many leading steps to skip: 10 % of the run (at least 5), then any further leading
    steps slower than the run's typical step by more than 3 scaled MADs (capped at a quarter)."""
    n = len(series)
    skip = max(t.DRIFT_MIN_SKIP, int(n * t.DRIFT_SKIP))
    level = typical(series)
    limit = level + t.DRIFT_SPIKE_MADS * _spread(series)
    while skip < n // 4 and series[skip] > limit:
        skip += 1
    return skip


def detect_drift(steps: Sequence[int], series: Sequence[float],
                 buckets: Sequence[int] | None = None) -> DriftAnalysis:
    """Compare the early baseline with the recent level; find where the recent level began.

    ``buckets``: for a series made of time buckets' means (from metrics: each step of a bucket holds
    its bucket's mean), each step's bucket. The noise is then judged over the buckets, the independent
    values, not over steps that repeat one value (they have no spread: any 10 % move read as drift)."""
    n = len(series)
    if n < t.DRIFT_MIN_STEPS:
        return DriftAnalysis(DriftKind.NOT_ENOUGH_STEPS)
    skip = warmup_steps(series)
    band = max(t.DRIFT_MIN_BAND, int(n * t.DRIFT_BAND))
    base_lo, base_hi = skip, skip + band
    recent_lo = n - band
    if recent_lo < base_hi:
        return DriftAnalysis(DriftKind.NOT_ENOUGH_STEPS)
    early, late = series[base_lo:base_hi], series[recent_lo:]
    baseline = typical(early)
    recent = typical(late)
    change = recent / baseline - 1.0 if baseline > 0 else 0.0
    kind = DriftKind.STABLE
    since = None
    band_buckets = None
    if buckets is None:
        noise = (_median_error(early) ** 2 + _median_error(late) ** 2) ** 0.5
    else:
        band_buckets = (len(set(buckets[base_lo:base_hi])), len(set(buckets[recent_lo:n])))
        noise = _bucket_noise(series, buckets, skip, band_buckets, (baseline, recent))
    if _is_drift(baseline, recent, change, noise, late):
        kind = DriftKind.SLOWING if change > 0 else DriftKind.SPEEDING_UP
        since = steps[_onset(series, skip, band // 2)]
    return DriftAnalysis(
        kind=kind,
        baseline_s=baseline,
        recent_s=recent,
        change=change,
        since_step=since,
        baseline_steps=(steps[base_lo], steps[base_hi - 1]),
        recent_steps=(steps[recent_lo], steps[-1]),
        band_buckets=band_buckets,
    )


def _bucket_noise(series: Sequence[float], buckets: Sequence[int], skip: int, counts: tuple[int, int],
                  levels: tuple[float, float]) -> float:
    """The standard error of the difference of the two bands' levels when each bucket's mean stands for
    its steps.

    One bucket's relative noise is the robust spread of the log ratios of successive buckets' means
    after the warm-up, over the square root of 2 (a level shift is one large ratio among many: it does
    not inflate it). Step times stretch with the load, so each band's noise is that share of its own
    level, over the square root of its bucket count (``counts``: the baseline's and the recent band's):
    a run whose load lifted half-way (many noisy slow buckets, then few quick ones) is judged on the
    quick band's small noise, not the slow band's."""
    means = [next(group)[0] for _, group in groupby(zip(series[skip:], buckets[skip:], strict=True),
                                                    key=itemgetter(1))]
    ratios = [math.log(b / a) for a, b in pairwise(means) if a > 0 and b > 0]
    if not ratios:
        return 0.0
    relative = MAD_TO_SD * statistics.median(abs(r) for r in ratios) / 2 ** 0.5
    return sum((relative * level) ** 2 / count for count, level in zip(counts, levels, strict=True)) ** 0.5


def _is_drift(baseline: float, recent: float, change: float, noise: float, late: Sequence[float]) -> bool:
    """Large, beyond the bands' noise, and held over both halves of the recent band."""
    if abs(change) < t.DRIFT_CHANGE or baseline <= 0:
        return False
    if abs(recent - baseline) < t.DRIFT_NOISE_Z * noise:
        return False
    half = len(late) // 2
    for part in (late[:half], late[half:]):
        moved = statistics.median(part) / baseline - 1.0
        if moved * change <= 0 or abs(moved) < t.DRIFT_CHANGE / 2:
            return False
    return True


def _onset(series: Sequence[float], first: int, shortest: int = 1) -> int:
    """Index where the series steps from its early level to its late level.

    The split that best fits the series from ``first`` on as two flat levels (least squares, by
    prefix sums); values are clipped to their 5th-95th percentiles first so single spikes do not
    pull the split, and each level holds at least ``shortest`` steps (a spike at the very end is
    not a level). A sharp change gives its exact step, a gradual one its middle.
    """
    tail = sorted(series[first:])
    low, high = tail[int(0.05 * (len(tail) - 1))], tail[int(0.95 * (len(tail) - 1))]
    values = [min(high, max(low, v)) for v in series[first:]]
    n = len(values)
    total = sum(values)
    total_sq = sum(v * v for v in values)
    shortest = max(1, min(shortest, n // 2))
    best, best_cost = shortest, float("inf")
    head = head_sq = 0.0
    for k in range(1, n):
        head += values[k - 1]
        head_sq += values[k - 1] ** 2
        if k < shortest or n - k < shortest:
            continue
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
    return tuple(describe_worst(window.per_rank[r][i], value, clock)
                 for value, r, i in heapq.nlargest(count, candidates))


def describe_worst(step: StepTiming, seconds: float, clock: Clock) -> WorstStep:
    """One slow step of ``seconds`` with its trace id and the component that dominated it."""
    parts = step_values(step, clock)
    name, part = _dominant(parts)
    return WorstStep(parts.step, parts.rank, seconds, parts.trace_id, name, part)


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
