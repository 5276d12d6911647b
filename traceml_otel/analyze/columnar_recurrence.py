"""The columnar engine's straggler recurrence: each window's culprit rank from per-window SQL sums.

:mod:`~traceml_otel.analyze.recurrence` defines the windows, the spike steps left out of each, the
culprit and the pattern. A window small enough to read as records (at most ``detail_rows`` rows) takes
the span reader's own pass, collective split included. A larger one reads each step's slowest rank
(one row per step) to find the spikes in Python, then sums every rank's kept steps per window in one
grouped query (:data:`~traceml_otel.analyze.columnar_sql.SUMS_BY`, by window and rank); the
straggler rule then runs on each window's means, without the waiting/transfer split of collective time
(as the columnar engine's whole-run means above that size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from traceml_otel.analyze.columnar_sql import SUMS_BY, measured_rows
from traceml_otel.analyze.findings import Finding, RankMetrics
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.measures import RankTotals
from traceml_otel.analyze.recurrence import (
    MIN_WINDOW_STEPS,
    StragglerRecurrence,
    culprit_of,
    kept_indices,
    recurrence_of,
    window_bounds,
    window_size,
)

SLOWEST_PER_STEP = """
    SELECT step, max(coalesce(input_wait_cpu, 0.0) + coalesce(traced_cpu, 0.0)) FROM w
    GROUP BY step ORDER BY step"""
"""``recurrence._without_spikes``' input: per step of the window, its slowest rank's fetch + block (CPU)."""

WINDOW_RANK_SUMS = SUMS_BY.format(keys="bucket, rank", rows="{rows}")
"""The rank sums per window (``bucket``) and rank."""


def kept_steps(numbers: Sequence[int], slowest: Sequence[float]) -> tuple[list[int], list[int], list[int]]:
    """(kept step numbers, their window index, each window's first step number): the windows of
    :func:`~traceml_otel.analyze.recurrence.window_bounds` less their spike steps, as the span reader's."""
    steps: list[int] = []
    buckets: list[int] = []
    starts: list[int] = []
    for index, (a, b) in enumerate(window_bounds(len(numbers))):
        kept = kept_indices(slowest[a:b])
        keep = range(a, b) if kept is None else [a + i for i in kept]
        steps.extend(numbers[i] for i in keep)
        buckets.extend([index] * len(keep))
        starts.append(numbers[a])
    return steps, buckets, starts


def table_recurrence(
    con: Any, clock: Clock, ranks: Sequence[int], window_numbers: Sequence[int],
    rule: Callable[[Sequence[RankMetrics]], Finding | object | None],
    totals_of: Callable[[Sequence[Any]], RankTotals],
) -> StragglerRecurrence | None:
    """Per-window culprits of view ``w`` (its steps are ``window_numbers``) from grouped SQL sums;
    ``None`` for one rank or too few steps for two windows. ``totals_of`` reads a ``RANK_SUMS`` row."""
    n = len(window_numbers)
    if len(ranks) < 2 or n < 2 * MIN_WINDOW_STEPS:
        return None
    rows = con.execute(SLOWEST_PER_STEP).fetchall()
    if [row[0] for row in rows] != list(window_numbers):
        return None
    steps, buckets, starts = kept_steps(list(window_numbers), [float(row[1]) for row in rows])
    con.execute("CREATE OR REPLACE TEMP TABLE recurrence_keep AS "
                "SELECT unnest(?::BIGINT[]) AS step, unnest(?::BIGINT[]) AS bucket", [steps, buckets])
    source = (f"SELECT k.bucket, x.* FROM ({measured_rows(clock, 'w')}) x "
              "JOIN recurrence_keep k USING (step)")
    per_window: list[dict[int, RankTotals]] = [{} for _ in starts]
    for row in con.execute(WINDOW_RANK_SUMS.format(rows=source)).fetchall():
        per_window[int(row[0])][int(row[1])] = totals_of(row[1:])
    empty = (0.0,) * 7  # a rank with no step in the window: every mean unavailable
    culprits = []
    for totals in per_window:
        metrics = tuple((totals.get(rank) or RankTotals(rank, 0, *empty, False, 0.0, 0.0)).means()
                        for rank in ranks)
        culprits.append(culprit_of(rule(metrics)))
    return recurrence_of(culprits, starts, window_size(n))
