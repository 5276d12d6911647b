"""The columnar engine's segments: the span reader's change-point search on series read in SQL.

:func:`~traceml_otel.analyze.segments.segment_series` cuts and labels; this module only reads its input
from view ``w`` (:data:`~traceml_otel.analyze.columnar_sql.SEGMENT_SERIES`: the step-time medians and the
shares of the same evenly spaced ranks the span reader reads) and diagnoses a segment from its steps'
SQL sums, so both engines give the same segments and the same reference verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from traceml_otel.analyze.columnar_sql import SEGMENT_BOUNDS, SEGMENT_SERIES, measured_rows
from traceml_otel.analyze.findings import StepDiagnosis
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.segments import (
    SHARE_STEPS,
    SegmentAnalysis,
    SegmentInput,
    segment_series,
    share_indices,
)


def table_segments(
    con: Any, clock: Clock, ranks: Sequence[int], window_numbers: Sequence[int],
    diagnose: Callable[[int, int], StepDiagnosis],
) -> SegmentAnalysis:
    """Segments of view ``w`` (its steps are ``window_numbers``); ``diagnose(first, last)`` diagnoses the
    steps numbered ``first`` to ``last``."""
    if not ranks or not window_numbers:
        return SegmentAnalysis((), 0)
    picked = ", ".join(str(int(ranks[i])) for i in share_indices(len(ranks)))
    rows = con.execute(SEGMENT_SERIES.format(picked=picked, rows=measured_rows(clock, "w"))).fetchall()
    if [row[0] for row in rows] != list(window_numbers):
        return SegmentAnalysis((), 0)
    series: list[float] = []
    for row in rows:  # a step no rank knows repeats the last (``events.median_series``)
        series.append(float(row[1]) if row[1] is not None else (series[-1] if series else 0.0))
    stride = max(1, -(-len(rows) // SHARE_STEPS))
    inputs: list[float | None] = []
    residuals: list[float | None] = []
    for index, row in enumerate(rows):  # every stride-th step's shares, the others repeat the last
        fresh = index % stride == 0
        inputs.append(row[2] if fresh else inputs[-1])
        residuals.append(row[3] if fresh else residuals[-1])
    starts = con.execute(SEGMENT_BOUNDS.format(rank=int(ranks[0]))).fetchall()

    def bounds(a: int, b: int) -> tuple[float | None, float | None]:
        if len(starts) != len(rows):
            return None, None
        first, last = starts[a], starts[b - 1]
        return (first[1] / 1e9 if first[1] else None,
                last[1] / 1e9 + (last[2] or 0.0) if last[1] else None)

    numbers = list(window_numbers)
    return segment_series(SegmentInput(numbers, series, inputs, residuals),
                          lambda a, b: diagnose(numbers[a], numbers[b - 1]), bounds)
