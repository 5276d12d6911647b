"""Every diagnosis and compare threshold in one place (values from docs/analyzer.md, matching TraceML)."""

from __future__ import annotations

SHARE_WARN = 0.10
"""Input, h2d and residual shares at or above this fire their rule."""
SHARE_CRITICAL = 0.20
"""... and at or above this they are critical."""
COMPUTE_SHARE = 0.90
"""Compute share at or above this (with the others under SHARE_WARN) is COMPUTE_BOUND."""
COMMUNICATION_WARN = 0.10
"""Transfer share (exposed collective time less waiting for other ranks), median over ranks, at or
above this: COMMUNICATION_BOUND."""
COMMUNICATION_CRITICAL = 0.20
COMMUNICATION_LATENCY_BYTES = 1 << 20
"""Collectives under this many bytes each (on average) are latency-bound: advice is fewer, larger calls."""
STRAGGLER_WARN = 0.10
STRAGGLER_CRITICAL = 0.20
STRAGGLER_COVERAGE = 0.80
"""An excess explaining at least this much of the straggler gap names the cause."""
MIN_STEPS = 2
"""Fewer steps per rank than this is WARMUP."""
MIN_STEPS_FOR_CRITICAL = 20
"""Fewer steps per rank than this caps severity at warning."""
PARTIAL_FRACTION = 0.95
"""PARTIAL_RANKS: a rank with fewer steps than this fraction of the fullest rank's is partial ..."""
PARTIAL_MIN_GAP = 2
"""... and only when it is at least this many steps short (a rank stopped by a signal may miss one)."""

MEMORY_MIN_STEPS = 50
PRESSURE_WARN = 0.92
PRESSURE_CRITICAL = 0.97
IMBALANCE_WARN = 0.20
IMBALANCE_WARN_PRESSURE = 0.30
IMBALANCE_CRITICAL = 0.30
IMBALANCE_CRITICAL_PRESSURE = 0.50
CREEP_BYTES = 1 << 30
"""Memory growth (recent band minus baseline band) at or above this is MEMORY_CREEP."""
CREEP_BANDS = ((0.15, 0.25), (0.45, 0.55), (0.90, 1.00))
"""Baseline, middle and recent bands, as fractions of the window."""

DRIFT_MIN_STEPS = 50
"""Fewer aligned steps than this is NOT_ENOUGH_STEPS for drift."""
DRIFT_CHANGE = 0.10
"""A recent step time this much above (or below) the early baseline is drift."""
DRIFT_NOISE_Z = 4.0
"""... and only when the change is at least this many standard errors of the difference of medians."""
DRIFT_BAND = 0.20
"""Baseline and recent windows are each this fraction of the run (at least DRIFT_MIN_BAND steps)."""
DRIFT_MIN_BAND = 10
DRIFT_SKIP = 0.10
"""Fraction of the first steps skipped as warm-up before the baseline (at least DRIFT_MIN_SKIP)."""
DRIFT_MIN_SKIP = 5
DRIFT_SPIKE_MADS = 3.0
"""A step more than this many scaled MADs from the median is a spike (left out of a band's typical
step time) or, at the start, still warm-up."""
WORST_STEPS = 5
"""How many of the slowest steps the report lists."""

COMPARE_TIME_CHANGE = 0.03
"""``compare``: a change in time per unit of work (or step, or phase) of at least this much is a
regression or an improvement."""
COMPARE_TIME_MATERIAL = 0.08
"""... and at least this much is material."""
COMPARE_MEMORY_CHANGE = 0.10
"""``compare``: a change in peak memory of at least this much is a regression or an improvement."""
COMPARE_WORK_DIFFERS = 0.01
"""``compare``: work per step differing by more than this fraction is "different work"."""
