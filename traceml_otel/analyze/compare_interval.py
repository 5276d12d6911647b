"""The change in time per unit of work between two sides of runs, with a 95 % interval.

Each run is a mean time per unit of work with its standard error from its own block means
(:mod:`traceml_otel.analyze.compare_noise`). The change is the ratio of the sides' geometric means
of run means, ``B / A - 1``, judged on the log scale:

- **Several runs on a side** (at least 3 runs in all): the spread between runs is measured. The
  variance of the log run means is pooled over both sides (both run the same machine and script),
  ``se = s_p * sqrt(1/nA + 1/nB)`` with ``nA + nB - 2`` degrees of freedom (a pooled t-test on run
  means), and never less than the runs' own within-run error.
- **One run per side**: only within-run noise is measurable. One run cannot see what changes
  between runs (the machine's load, CPU frequency, memory placement), so an allowance per run is added
  in quadrature, and the comparison says so: :data:`RUN_TO_RUN_CV` (plus :data:`LOADED_CV_PER_WAIT`
  times its CPU-wait share), or :data:`SPREAD_FACTOR` times the spread of its own block means when
  that is larger (a run whose blocks differ by 15 % from each other is no closer than that to a
  rerun). Degrees of freedom: Welch-Satterthwaite over the runs' block counts.
- **A busier machine only ever slows a run** (a one-sided bound, both cases). Other work on the
  machine slows the training thread even while it holds a CPU (a hyper-thread sibling, shared caches,
  memory bandwidth), and more waiting for a CPU means more cold restarts. When side B ran on a busier
  machine than A, the interval's low end is moved down by :data:`LOAD_SLOPE` times the growth in the
  share of the machine's CPUs other work kept busy, plus :data:`WAIT_SLOPE` times the growth in the
  share of time B waited for a CPU (and the high end up when A was the busier): a change the load can
  explain is never called a regression, while an improvement on a busier machine still counts.
  With several runs per side the bound applies only when the sides' loads differ by more than twice
  the standard error their runs' own spread gives (interleaved runs share the machine's moods, and
  the pooled spread between runs already holds them).

The verdict of an interval against the threshold ``tau`` (3 %, TraceML's): ``regression`` when it lies
wholly at or above ``+tau``, ``improvement`` when wholly at or below ``-tau``, ``equivalent`` when it
lies inside ``(-tau, +tau)``, else ``inconclusive``. The 95 % quantile of Student's t is scipy's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from traceml_otel.analyze import thresholds as t

CONFIDENCE = 0.95
RUN_TO_RUN_CV = 0.025
"""Relative standard deviation between runs of the same script assumed when each side has one run and
its training thread never waited for a CPU."""
LOADED_CV_PER_WAIT = 0.03
"""... plus this much per unit of the share of its wall time the run waited for a CPU: a run on a
loaded machine also loses CPU it cannot see (a hypervisor's, its neighbours' caches), so even its
on-CPU time varies more from run to run. Calibrated on the A/A pairs of ``benchmarks/compare_aa.py``
on a shared 2-core VM (on-CPU time per sample of identical runs differed by up to 16 % at the same
machine load, 60-85 % CPU wait): the smallest value with no A/A regression there was 0.02; this is
one notch above (see docs/analyzer.md)."""


SPREAD_FACTOR = 1.0
"""A run alone on its side is assumed to differ from a rerun by at least this many times the relative
spread (standard deviation over mean) of its own block means. Calibrated with the two constants below on
the 40 A/A pairs of ``benchmarks/compare_aa.py`` (two sessions, one of them loaded by other jobs, half
with a CPU hog beside one side): no A/A regression with them, 4 of 40 with none of the three."""
LOAD_SLOPE = 0.6
"""The most a run's time per unit of work (log) is assumed to grow per unit of growth in the share of the
machine's CPUs that other work kept busy beside it (one busy process per core beside one side of an
A/A pair on a 2-core VM: up to +29 % on-CPU time at +0.5 of the machine)."""
WAIT_SLOPE = 0.5
"""... and per unit of growth in the share of its wall time it waited for a CPU."""


@dataclass(frozen=True, slots=True)
class RunMean:
    """One run's mean time per unit of work and its standard error (``se`` ``None``: not estimated)."""

    mean: float
    se: float | None
    df: float
    wait: float | None = None
    """The share of its wall time the run waited for a CPU (``None``: not recorded)."""
    spread: float = 0.0
    """The relative standard deviation of its block means."""
    load: float | None = None
    """The share of the machine's CPUs that other work kept busy beside it (``None``: not recorded)."""

    @property
    def allowance(self) -> float:
        """The run's run-to-run allowance (relative standard deviation) when it is alone on its side."""
        return max(RUN_TO_RUN_CV + LOADED_CV_PER_WAIT * (self.wait or 0.0), SPREAD_FACTOR * self.spread)


@dataclass(frozen=True, slots=True)
class Interval:
    """A relative change with its 95 % interval, the verdict it gives and how it was estimated."""

    name: str
    before: float
    after: float
    change: float
    low: float
    high: float
    verdict: str
    method: str
    between_runs: bool
    """The spread between runs was measured (several runs on a side); else only within-run noise."""
    load_confounded: bool = False
    """Not judged: the sides' machine loads differed so that the change cannot be told from them
    (``compare_judged``); the verdict is then inconclusive whatever the bounds say."""

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def judge(low: float, high: float, threshold: float = t.COMPARE_TIME_CHANGE) -> str:
    """The verdict of an interval of relative change against ``threshold``."""
    if low >= threshold:
        return "regression"
    if high <= -threshold:
        return "improvement"
    if low > -threshold and high < threshold:
        return "equivalent"
    return "inconclusive"


def change_interval(
    name: str, a: Sequence[RunMean], b: Sequence[RunMean], allowance_cv: float | None = None
) -> Interval | None:
    """The change from side ``a`` to side ``b`` with its interval; ``None`` when a run has no positive
    finite mean or no standard error. ``allowance_cv``: the run-to-run allowance per run with one run
    per side (default: each run's :attr:`RunMean.allowance`)."""
    import numpy as np
    from scipy import stats

    runs = [*a, *b]
    if not a or not b or any(r.se is None or not _positive(r.mean) or not math.isfinite(r.se) for r in runs):
        return None
    log_a = np.log([r.mean for r in a])
    log_b = np.log([r.mean for r in b])
    d = float(log_b.mean() - log_a.mean())
    within = [(r.se or 0.0) / r.mean for r in runs]
    within_a = sum(w * w for w in within[: len(a)]) / len(a) ** 2
    within_b = sum(w * w for w in within[len(a):]) / len(b) ** 2
    df_total = len(a) + len(b) - 2
    if df_total >= 1:
        squares = float(((log_a - log_a.mean()) ** 2).sum()) + float(((log_b - log_b.mean()) ** 2).sum())
        pooled = squares / df_total
        var = pooled * (1 / len(a) + 1 / len(b))
        df = float(df_total)
        if var < within_a + within_b:  # the runs agree more closely than their own noise allows
            var, df = within_a + within_b, _welch_df(runs, within, len(a))
        method = (f"pooled t over {len(a)}+{len(b)} runs (between-run spread, {METHOD_NOTE})")
        between = True
    else:
        each = [allowance_cv if allowance_cv is not None else r.allowance for r in runs]
        allowance = sum(cv * cv for cv in each)
        var = within_a + within_b + allowance
        df = _welch_df(runs, within, 1, extra=allowance)
        method = (f"within-run {METHOD_NOTE} + run-to-run allowance {each[0] * 100:.1f} % (A), "
                  f"{each[1] * 100:.1f} % (B)")
        between = False
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, max(df, 1.0))) * math.sqrt(var)
    slower_b, slower_a = contention_bound(a, b)
    if slower_b or slower_a:
        method += (f"; a busier machine's slowdown bounded ({slower_b * 100:.1f} % on B, "
                   f"{slower_a * 100:.1f} % on A)")
    change = math.expm1(d)
    low, high = math.expm1(d - half - slower_b), math.expm1(d + half + slower_a)
    before = float(np.exp(log_a.mean()))
    after = float(np.exp(log_b.mean()))
    return Interval(name, before, after, round(change, 9), low, high, judge(low, high), method, between)


METHOD_NOTE = "batch means of steady steps"


def contention_bound(a: Sequence[RunMean], b: Sequence[RunMean]) -> tuple[float, float]:
    """(how much of B's time, how much of A's, on the log scale, a busier machine may explain): the
    growth from one side to the other in the machine's share kept busy by other work times
    :data:`LOAD_SLOPE`, plus the growth in CPU-wait share times :data:`WAIT_SLOPE`; zero for the side that
    ran on the quieter machine, and for what either side did not record."""

    def side(runs: Sequence[RunMean], name: str) -> list[float] | None:
        values = [getattr(r, name) for r in runs]
        return None if any(v is None for v in values) else values

    slower_b = slower_a = 0.0
    for name, slope in (("load", LOAD_SLOPE), ("wait", WAIT_SLOPE)):
        before, after = side(a, name), side(b, name)
        if before is None or after is None:
            continue
        growth = sum(after) / len(after) - sum(before) / len(before)
        if len(before) + len(after) >= 3 and abs(growth) <= 2 * _spread_of_difference(before, after):
            continue  # several runs, loads as alike as between runs of a side: the pooled spread holds it
        slower_b += slope * max(0.0, growth)
        slower_a += slope * max(0.0, -growth)
    return slower_b, slower_a


def _spread_of_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """Standard error of the difference of two sides' means, from their pooled spread."""
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    squares = sum((x - mean_a) ** 2 for x in a) + sum((x - mean_b) ** 2 for x in b)
    dof = len(a) + len(b) - 2
    return math.sqrt(squares / dof * (1 / len(a) + 1 / len(b))) if dof > 0 else 0.0


def _welch_df(runs: Sequence[RunMean], within: Sequence[float], _: int, extra: float = 0.0) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of the runs' variances (``extra`` known exactly)."""
    total = sum(w * w for w in within) + extra
    denominator = sum((w * w) ** 2 / max(r.df, 1.0) for w, r in zip(within, runs, strict=True))
    if denominator <= 0:
        return 1e6
    return max(1.0, total * total / denominator)


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0
