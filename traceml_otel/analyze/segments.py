"""Verdicts per segment: where the step time or the phase mix changed, and what each part of the run was.

The window's step series (per aligned step, the median over ranks of the step time, and the median
over up to :data:`SHARE_RANKS` ranks of the input-wait and residual shares) is cut into segments by
change-point detection (``ruptures``' PELT on an L2 cost, computed from prefix sums:
:mod:`~traceml_otel.analyze.segment_cost`). The penalty is scaled to the series' own
noise, so a steady run gives one segment whatever its noise:

- each signal is reduced to at most :data:`MAX_POINTS` block medians (long runs), then passed through a
  5-point running median (a burst of one or two slow steps is a spike, never a segment), and a
  segment holds at least 1/20 of the points;
- its noise is the robust standard deviation of the differences between points (``1.4826 * MAD(diff) /
  sqrt(2)``, which level shifts hardly inflate), at lag 1 and at a lag of 2 % of the points (so a loaded
  machine's slow wander counts as noise), the larger of the two; the signal is divided by it;
- the penalty per change point is :data:`PENALTY_PER_SIGNAL` ``* log(points)`` per signal (a BIC-like
  penalty, stricter than BIC's ``2 log n``);
- candidate segments whose typical step time differs by less than :data:`SEGMENT_CHANGE` (25 %) and whose
  shares differ by less than :data:`SHARE_CHANGE` (0.10) from a neighbour are joined again (the pair
  least apart first), so a cut only stays where a user would see a different run.

Each segment is diagnosed with the step-time rules on its own steps. The segment holding most of the
training time at its typical pace (steps x median step: :func:`typical_seconds`, so that one slow
step cannot make the steps around it the reference) is the reference (``steady``; segments at the same
level, under the thresholds above apart, count their time together, then the largest of them); the
run's primary verdict is its verdict. The others are
labelled ``warm-up`` (the first segment, slower), ``slow period`` or ``fast period`` (by their typical
step time against the reference), or ``phase mix changed`` (same speed, other shares).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from traceml_otel.analyze.findings import StepDiagnosis
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.measures import step_values
from traceml_otel.analyze.window import StepWindow

MIN_STEPS = 50
"""Fewer aligned steps than this: one segment, no change-point search (drift's minimum too)."""
MAX_POINTS = 400
"""Block medians the search sees at most (a longer run is reduced first)."""
PENALTY_PER_SIGNAL = 4.0
"""Penalty per change point, per signal, in units of ``log(points)`` (noise-scaled signals)."""
MIN_SEGMENT = 3
"""Points a segment holds at least (blocks of a long run) ..."""
MIN_SEGMENT_SHARE = 1 / 20
"""... and at least this share of the points (a burst of slow steps is not a period)."""
NOISE_LAG = 0.02
"""The second lag of the noise estimate, as a share of the points (8 steps of 400)."""
SMOOTH = 5
"""Width of the running median applied before the search (bursts of up to 2 slow steps vanish)."""
SEGMENT_CHANGE = 0.25
"""Neighbouring segments whose typical step times differ by less than this are one segment ..."""
SHARE_CHANGE = 0.10
"""... unless their input-wait or residual shares differ by at least this much."""
SHARE_RANKS = 16
"""Ranks (evenly spaced) whose per-step shares are read; the step time reads every rank."""
SHARE_STEPS = 20_000
"""Steps whose shares are read at most (every k-th step of a longer run; the others repeat the last)."""
MAX_SEGMENTS = 12
"""Segments reported at most (the cuts with the largest changes are kept)."""

STEADY, WARM_UP, SLOW, FAST, MIX = "steady", "warm-up", "slow period", "fast period", "phase mix changed"


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of the run with its own level: its steps, time, typical step time and verdict."""

    first_step: int
    last_step: int
    steps: int
    start_unix: float | None
    end_unix: float | None
    typical_s: float
    """Median step time over its steps (median over ranks per step)."""
    seconds: float
    """Training time in it: the sum of its steps' times."""
    input_share: float | None
    residual_share: float | None
    label: str
    """``steady`` (the reference), ``warm-up``, ``slow period``, ``fast period`` or ``phase mix changed``."""
    change: float
    """Typical step time against the reference segment's (``+0.40``: 40 % slower)."""
    verdict: str
    """The primary diagnosis kind of its own steps."""
    severity: str = ""
    title: str = ""


@dataclass(frozen=True, slots=True)
class SegmentAnalysis:
    """The segments of the analysed window, in step order, and which one is the reference."""

    segments: tuple[Segment, ...]
    reference: int
    """Index of the segment holding most of the training time at its typical pace (the run's primary
    verdict)."""
    method: str = ""

    @property
    def primary(self) -> Segment | None:
        return self.segments[self.reference] if self.segments else None


def _noise(values: Sequence[float]) -> float:
    """Robust standard deviation from differences at lag 1 and at lag NOISE_LAG of the points, whichever
    is larger: insensitive to level shifts, and a machine's slow wander counts as noise too."""
    if len(values) < 3:
        return 0.0
    found = 0.0
    for lag in {1, max(1, int(len(values) * NOISE_LAG))}:
        diffs = [b - a for a, b in zip(values, values[lag:], strict=False)]
        center = statistics.median(diffs)
        found = max(found, 1.4826 * statistics.median(abs(d - center) for d in diffs) / math.sqrt(2))
    return found


def _blocks(values: Sequence[float], size: int) -> list[float]:
    return [statistics.median(values[i:i + size]) for i in range(0, len(values), size)]


def _smooth(values: Sequence[float]) -> list[float]:
    """A running median of SMOOTH points (shorter at the ends)."""
    half = SMOOTH // 2
    return [statistics.median(values[max(0, i - half):i + half + 1]) for i in range(len(values))]


def change_points(signals: Sequence[Sequence[float]]) -> list[int]:
    """Indices (into the signals) where a new segment starts, from PELT on the noise-scaled signals."""
    import numpy as np
    import ruptures

    from traceml_otel.analyze.segment_cost import prefix_sum_l2_cost

    n = len(signals[0])
    size = max(1, -(-n // MAX_POINTS))
    columns = []
    for signal in signals:
        blocks = _blocks(signal, size)
        sigma = _noise(blocks)
        if sigma <= 0:
            spread = max(blocks) - min(blocks)
            sigma = spread * 1e-3 if spread > 0 else 1.0
        columns.append([v / sigma for v in _smooth(blocks)])
    matrix = np.array(columns, dtype=float).T
    points = matrix.shape[0]
    shortest = max(MIN_SEGMENT, math.ceil(points * MIN_SEGMENT_SHARE))
    if points < 2 * shortest:
        return []
    penalty = PENALTY_PER_SIGNAL * math.log(points) * len(signals)
    search = ruptures.Pelt(custom_cost=prefix_sum_l2_cost(), min_size=shortest, jump=1)
    ends = search.fit(matrix).predict(pen=penalty)
    return [min(n, end * size) for end in ends[:-1]]


def share_indices(count: int) -> list[int]:
    """Indices of the ranks whose shares are read: up to :data:`SHARE_RANKS`, spread over the ranks."""
    wanted = min(count, SHARE_RANKS)
    return sorted({round(i * (count - 1) / max(1, SHARE_RANKS - 1)) for i in range(wanted)})


def _shares(window: StepWindow, clock: Clock) -> tuple[list[float | None], list[float | None]]:
    """Per aligned step: median over up to SHARE_RANKS ranks of the input-wait and residual shares."""
    picked = share_indices(len(window.ranks))
    inputs: list[float | None] = []
    residuals: list[float | None] = []
    stride = max(1, -(-window.steps // SHARE_STEPS))
    for index in range(window.steps):
        if index % stride:
            inputs.append(inputs[-1])
            residuals.append(residuals[-1])
            continue
        found_in, found_res = [], []
        for r in picked:
            v = step_values(window.per_rank[r][index], clock)
            total = v.step_time
            if total is None or total <= 0:
                continue
            if v.input_wait is not None:
                found_in.append(v.input_wait / total)
            if v.residual is not None:
                found_res.append(v.residual / total)
        inputs.append(statistics.median(found_in) if found_in else None)
        residuals.append(statistics.median(found_res) if found_res else None)
    return inputs, residuals


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


Level = tuple[float, float | None, float | None]
"""A segment's typical step time, input-wait share and residual share."""


def pace_apart(a: float, b: float) -> float:
    """How far apart two typical step times are, in units of :data:`SEGMENT_CHANGE`, the same whichever
    comes first (the slower over the faster: 60 and 77 ms are 28 % apart both ways; measured from the
    slower one it read 22 %, and a join that kept them apart then labelled both ``steady``)."""
    low, high = min(a, b), max(a, b)
    return (high / low - 1.0) / SEGMENT_CHANGE if low > 0 else 0.0


def _differ(a: Level, b: Level) -> float:
    """How far apart two segments are, in units of their thresholds (>= 1: keep them apart); symmetric."""
    ratio = pace_apart(a[0], b[0])
    for x, y in ((a[1], b[1]), (a[2], b[2])):
        if x is not None and y is not None:
            ratio = max(ratio, abs(x - y) / SHARE_CHANGE)
    return ratio


def _joined(bounds: list[int], series: Sequence[float], inputs: Sequence[float | None],
            residuals: Sequence[float | None]) -> list[int]:
    """Cut indices left after joining neighbours that do not differ materially."""
    cuts = list(bounds)
    while cuts:
        edges = [0, *cuts, len(series)]
        levels = [(statistics.median(series[a:b]), _mean(inputs[a:b]), _mean(residuals[a:b]))
                  for a, b in pairwise(edges)]
        gaps = [_differ(levels[i], levels[i + 1]) for i in range(len(cuts))]
        weakest = min(range(len(cuts)), key=gaps.__getitem__)
        if gaps[weakest] >= 1.0 and len(cuts) < MAX_SEGMENTS:
            break
        del cuts[weakest]
    return cuts


def segment_window(
    window: StepWindow, series: Sequence[float], clock: Clock,
    diagnose: Callable[[StepWindow], StepDiagnosis],
) -> SegmentAnalysis:
    """Segments of ``window`` (``series``: its per-step median-over-ranks step times, one per aligned
    step); ``diagnose`` gives a sub-window's step diagnosis."""
    n = window.steps
    if n == 0 or len(series) != n:
        return SegmentAnalysis((), 0)
    inputs, residuals = _shares(window, clock)

    def bounds(a: int, b: int) -> tuple[float | None, float | None]:  # the first rank's clock
        if not window.per_rank:
            return None, None
        first, last = window.per_rank[0][a], window.per_rank[0][b - 1]
        return (first.start_unix_nano / 1e9 if first.start_unix_nano else None,
                last.start_unix_nano / 1e9 + (last.traced_cpu or 0.0) if last.start_unix_nano else None)

    return segment_series(SegmentInput(window.step_numbers, series, inputs, residuals),
                          lambda a, b: diagnose(_sub_window(window, a, b)), bounds)


@dataclass(frozen=True, slots=True)
class SegmentInput:
    """What the search reads, one value per aligned step of the window: its number, the median over
    ranks of its step time, and the median over up to :data:`SHARE_RANKS` ranks of its input-wait and
    residual shares (``None`` where unknown)."""

    step_numbers: Sequence[int]
    series: Sequence[float]
    inputs: Sequence[float | None]
    residuals: Sequence[float | None]


def segment_series(
    found: SegmentInput, diagnose: Callable[[int, int], StepDiagnosis],
    bounds: Callable[[int, int], tuple[float | None, float | None]],
) -> SegmentAnalysis:
    """Segments of a window given as series (both engines): ``diagnose(a, b)`` diagnoses the steps at
    indices ``a`` to ``b - 1``, ``bounds(a, b)`` gives their start and end (Unix seconds)."""
    series, inputs, residuals = found.series, found.inputs, found.residuals
    n = len(series)
    if n == 0 or not len(inputs) == len(residuals) == len(found.step_numbers) == n:
        return SegmentAnalysis((), 0)
    cuts: list[int] = []
    method = (f"PELT (ruptures, L2) on log step time, input-wait and residual shares; penalty "
              f"{PENALTY_PER_SIGNAL:g} x log(points) per signal in noise units; neighbours under "
              f"{SEGMENT_CHANGE:.0%} apart in step time and {SHARE_CHANGE:.2f} in shares joined")
    if n >= MIN_STEPS:
        logs = [math.log(max(v, 1e-9)) for v in series]
        signals: list[Sequence[float]] = [logs]
        for share in (inputs, residuals):
            if all(v is not None for v in share):
                signals.append(share)  # type: ignore[arg-type]
        cuts = _joined(change_points(signals), series, inputs, residuals)
    edges = [0, *cuts, n]
    parts = list(pairwise(edges))
    seconds = [sum(series[a:b]) for a, b in parts]
    levels = [(statistics.median(series[a:b]), _mean(inputs[a:b]), _mean(residuals[a:b])) for a, b in parts]
    typical = typical_seconds([b - a for a, b in parts], [level[0] for level in levels])
    alike = [sum(t for t, other in zip(typical, levels, strict=True) if _differ(level, other) < 1.0)
             for level in levels]  # segments at the same level hold their training time together
    reference = max(range(len(parts)), key=lambda i: (alike[i], typical[i]))
    ref_level = statistics.median(series[parts[reference][0]:parts[reference][1]])
    ref_shares = (_mean(inputs[slice(*parts[reference])]), _mean(residuals[slice(*parts[reference])]))
    out = []
    for index, (a, b) in enumerate(parts):
        level = statistics.median(series[a:b])
        change = level / ref_level - 1.0 if ref_level > 0 else 0.0
        shares = (_mean(inputs[a:b]), _mean(residuals[a:b]))
        if index == reference:
            label = STEADY
        elif pace_apart(level, ref_level) >= 1.0:
            label = WARM_UP if index == 0 and change > 0 else SLOW if change > 0 else FAST
        elif _differ((level, *shares), (level, *ref_shares)) >= 1.0:
            label = MIX
        else:
            label = STEADY
        diagnosis = diagnose(a, b) if len(parts) > 1 else None
        start_unix, end_unix = bounds(a, b)
        out.append(Segment(
            first_step=found.step_numbers[a], last_step=found.step_numbers[b - 1], steps=b - a,
            start_unix=start_unix, end_unix=end_unix,
            typical_s=level, seconds=seconds[index], input_share=shares[0], residual_share=shares[1],
            label=label, change=change,
            verdict=str(diagnosis.primary.kind) if diagnosis else "",
            severity=str(diagnosis.primary.severity) if diagnosis else "",
            title=diagnosis.primary.title if diagnosis else "",
        ))
    return SegmentAnalysis(tuple(out), reference, method)


def typical_seconds(steps: Sequence[int], typical_s: Sequence[float]) -> list[float]:
    """Each segment's training time at its typical pace (steps x median step), what the reference is
    chosen by: a step or two far slower than their segment (a checkpoint saved inside a step, 0.9 s
    among 2 ms steps, which would hold most of a short run's raw time) weigh no more than their
    segment's pace, while a sustained slow period weighs all its time."""
    return [n * t for n, t in zip(steps, typical_s, strict=True)]


def _sub_window(window: StepWindow, a: int, b: int) -> StepWindow:
    return StepWindow(window.ranks, window.step_numbers[a:b], tuple(steps[a:b] for steps in window.per_rank))


def reference_window(window: StepWindow, analysis: SegmentAnalysis) -> StepWindow:
    """The steps of the reference segment (the whole window when there is one segment)."""
    if len(analysis.segments) < 2:
        return window
    seg = analysis.segments[analysis.reference]
    numbers = window.step_numbers
    a = numbers.index(seg.first_step)
    return _sub_window(window, a, a + seg.steps)
