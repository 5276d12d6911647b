"""The SQL the columnar engine pushes into DuckDB: per-rank sums, per-step series, the window.

Each query mirrors one Python pass of the span reader, named beside it; the per-rank sums fill the
same :class:`~traceml_otel.analyze.measures.RankTotals` that :func:`~traceml_otel.analyze.measures.
rank_metrics` fills, so both engines take their means from one definition, and
``tests/analyze/test_columnar.py`` holds the sums equal on runs that exercise every branch (missing
signals, collectives inside phases, GPU clocks, prefetch copies, failed steps). Clock-dependent
columns are chosen by :func:`clock_columns`; table ``w`` is the analysed window, ``a`` the aligned run.
"""

from __future__ import annotations

from traceml_otel.analyze.kinds import Clock
from traceml_otel.wire.step_schema import H2D_BEFORE_STEP

_K = "{k}"
_H2D_BEFORE = " + ".join(f"coalesce({f.column}, 0.0)" for f in H2D_BEFORE_STEP) or "0.0"
"""``StepTiming.h2d_before_cpu`` (0 where unmeasured): the columns of the fields that sum into h2d."""
_H2D_BEFORE_SEEN = " OR ".join(f"{f.column} IS NOT NULL" for f in H2D_BEFORE_STEP) or "false"


def clock_columns(clock: Clock) -> str:
    """Per-row expressions on ``clock`` (a subquery's select list over the table ``{source}``).

    As in ``rank_metrics``: the exposed collective time measured inside a phase leaves that phase;
    optimizer and in-step H2D count 0 on a step without them; the step time is input wait + traced +
    loader-side prefetch copies, ``NULL`` when either of the first two is missing.
    """
    k = "gpu" if clock is Clock.GPU else "cpu"
    comm_ok = f"(comm_calls IS NOT NULL AND comm_exposed_{k} IS NOT NULL)"

    def without_waits(phase: str) -> str:
        return (f"CASE WHEN {comm_ok} AND {k}_{phase} IS NOT NULL "
                f"THEN greatest(0.0, {k}_{phase} - coalesce(comm_in_{phase}_{k}, 0.0)) ELSE {k}_{phase} END")

    optimizer = (f"CASE WHEN {comm_ok} THEN greatest(0.0, coalesce({k}_optimizer, 0.0) - "
                 f"coalesce(comm_in_optimizer_{k}, 0.0)) ELSE coalesce({k}_optimizer, 0.0) END")
    return f"""
        rank, step, peak_allocated, peak_reserved, memory_total, ({_H2D_BEFORE_SEEN}) AS h2d_before_seen,
        calls_h2d,
        optimizer_steps, coalesce(skipped_updates, 0) AS skipped, samples, tokens, between_cpu, comm_calls,
        comm_bytes,
        comm_{k} AS comm_whole, comm_exposed_{k} AS comm_exposed,
        input_wait_{k} AS wait, traced_{k} AS traced,
        {without_waits("forward")} AS forward, {without_waits("backward")} AS backward,
        {optimizer} AS optimizer, coalesce({k}_h2d, 0.0) AS h2d_in,
        coalesce({k}_h2d, 0.0) + {_H2D_BEFORE} AS h2d,
        CASE WHEN {comm_ok} THEN comm_exposed_{k} ELSE 0.0 END AS exposed"""


def measured_rows(clock: Clock, source: str) -> str:
    """Rows of ``source`` with their compute, residual and step time on ``clock``."""
    return f"""
        SELECT *, forward + backward + optimizer AS compute,
            greatest(0.0, traced - h2d_in - (forward + backward + optimizer) - exposed) AS residual,
            wait + traced + (h2d - h2d_in) AS whole
        FROM (SELECT {clock_columns(clock)} FROM {source})"""


SUMS_BY = """
    SELECT {keys}, count(*) AS steps,
        sum(whole), bool_or(whole IS NULL),
        sum(wait), bool_or(wait IS NULL), sum(traced), bool_or(traced IS NULL),
        sum(forward), bool_or(forward IS NULL), sum(backward), bool_or(backward IS NULL),
        sum(optimizer), sum(h2d), bool_or(h2d_before_seen OR calls_h2d > 0),
        sum(compute), sum(residual),
        sum(optimizer_steps), count(*) FILTER (WHERE optimizer_steps = 0 AND skipped = 0),
        sum(samples), count(samples), sum(tokens), count(tokens),
        bool_or(comm_calls IS NOT NULL),
        sum(coalesce(comm_bytes, 0)) FILTER (WHERE comm_calls IS NOT NULL),
        sum(comm_calls),
        bool_or(comm_calls IS NOT NULL AND comm_whole IS NULL),
        sum(coalesce(comm_whole, 0.0)) FILTER (WHERE comm_calls IS NOT NULL),
        bool_or(comm_calls IS NOT NULL AND comm_exposed IS NULL),
        sum(comm_exposed) FILTER (WHERE comm_calls IS NOT NULL),
        sum(between_cpu), count(between_cpu), sum(skipped)
    FROM ({rows}) GROUP BY {keys} ORDER BY {keys}"""
"""One row per value of ``keys`` (their columns first): the sums ``rank_metrics`` keeps, in
:func:`~traceml_otel.analyze.columnar.rank_totals` order."""

RANK_SUMS = SUMS_BY.format(keys="rank", rows="{rows}")
""":data:`SUMS_BY` one row per rank."""

HAS_GPU_TIMING = """
    traced_gpu IS NOT NULL AND input_wait_gpu IS NOT NULL
    AND (calls_forward = 0 OR gpu_forward IS NOT NULL) AND (calls_backward = 0 OR gpu_backward IS NOT NULL)
    AND (calls_optimizer = 0 OR gpu_optimizer IS NOT NULL) AND (calls_h2d = 0 OR gpu_h2d IS NOT NULL)"""
"""``StepTiming.has_gpu_timing`` as a row predicate."""

STEP_MEDIANS = """
    SELECT step, median(whole_or_traced) FROM (
        SELECT step, coalesce(whole, traced) AS whole_or_traced FROM ({rows}))
    WHERE whole_or_traced IS NOT NULL GROUP BY step ORDER BY step"""
"""``drift.step_series``: per aligned step, the median over ranks of the step time (traced where the
input wait is missing), steps with none left out."""

RANK_BUCKETS = """
    SELECT rank, min(step), avg(whole_or_traced), max(peak_reserved) FROM (
        SELECT rank, step, peak_reserved, coalesce(whole, traced) AS whole_or_traced,
            (row_number() OVER (PARTITION BY rank ORDER BY step) - 1) // {size} AS bucket
        FROM ({rows}))
    GROUP BY rank, bucket HAVING count(whole_or_traced) > 0 ORDER BY rank, bucket"""
"""``drift.rank_series``: each rank's step time averaged into buckets of ``size`` steps; the bucket's
highest reserved peak (``max(peak_reserved)`` of the bucket's steps)."""

WORST = """
    SELECT rank, step, coalesce(whole, traced) AS seconds FROM ({rows})
    WHERE coalesce(whole, traced) IS NOT NULL ORDER BY seconds DESC, rank DESC, step DESC LIMIT {count}"""
"""``drift.worst_steps``: the slowest (rank, step) records, ties as ``heapq.nlargest`` breaks them."""

PEAK_SERIES = """
    SELECT max(peak), median(peak) FROM (
        SELECT step, coalesce(peak_allocated, peak_reserved) AS peak FROM w)
    WHERE peak IS NOT NULL GROUP BY step ORDER BY step"""
"""``memory._peak_series``: per step with any peak, the worst rank's and the median rank's."""

STALL_CANDIDATES = """
    WITH s AS (
        SELECT rank, step, row_number() OVER (PARTITION BY rank ORDER BY step) AS nth,
            coalesce(input_wait_cpu, 0.0) + coalesce(traced_cpu, 0.0)
            + greatest(0.0, coalesce(between_cpu, 0.0) - coalesce(input_wait_cpu, 0.0)) AS busy
        FROM r WHERE error IS NULL),
    t AS (
        SELECT rank, busy, row_number() OVER (PARTITION BY rank ORDER BY busy) - 1 AS pos,
            count(*) OVER (PARTITION BY rank) AS n
        FROM s WHERE nth > {skip}),
    l AS (
        SELECT rank, max(n) AS n,
            max(busy) FILTER (WHERE pos = CAST(floor({percentile} * (n - 1) + 0.5) AS BIGINT)) AS high,
            max(busy) FILTER (WHERE pos = CAST(floor(0.5 * (n - 1) + 0.5) AS BIGINT)) AS typical
        FROM t GROUP BY rank),
    b AS (
        SELECT rank, max(backward) FILTER (WHERE pos = n // 2) AS typical_backward FROM (
            SELECT rank, coalesce(cpu_backward, 0.0) AS backward,
                row_number() OVER (PARTITION BY rank ORDER BY coalesce(cpu_backward, 0.0)) - 1 AS pos,
                count(*) OVER (PARTITION BY rank) AS n
            FROM r WHERE error IS NULL)
        GROUP BY rank)
    SELECT s.rank, s.step, s.busy - l.typical AS excess, b.typical_backward
    FROM s JOIN l USING (rank) JOIN b USING (rank)
    WHERE s.nth > {skip} AND l.n >= 3 AND s.busy - l.typical > greatest({factor} * l.high, {minimum})
    ORDER BY excess DESC, s.rank, s.step LIMIT {limit}"""
"""``stalls.rank_candidates``: per rank (completed steps, in step order, the first ``skip`` left out),
the steps whose span (input wait + block + unnamed time before it) exceeds the typical span by more than
``factor`` x the ``percentile`` span (nearest rank, as the span reader's) and at least ``minimum``
seconds; with the excess and the rank's typical backward time (upper median over all its steps)."""

SEGMENT_SERIES = """
    SELECT step, median(coalesce(whole, traced)),
        median(wait / whole) FILTER (WHERE rank IN ({picked}) AND whole > 0 AND wait IS NOT NULL),
        median(residual / whole) FILTER (WHERE rank IN ({picked}) AND whole > 0 AND compute IS NOT NULL)
    FROM ({rows}) GROUP BY step ORDER BY step"""
"""``segments.segment_window``'s input: per step of the window, the median over ranks of the step time
(traced where the input wait is missing) and the median over the ``picked`` ranks of the input-wait
and residual shares of the step time (no residual where compute is unknown: ``greatest`` skips NULLs)."""

SEGMENT_BOUNDS = """
    SELECT step, start_unix_nano, traced_cpu FROM w WHERE rank = {rank} ORDER BY step"""
"""The first rank's step starts and traced times: a segment's time range."""
