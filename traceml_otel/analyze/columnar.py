"""The columnar engine: diagnose a run folder from its step tables in DuckDB, without reading its spans.

The same window, clock, sums, series and rules as :func:`~traceml_otel.analyze.diagnose.analyze_run`:
the heavy passes over every step run as SQL (:mod:`traceml_otel.analyze.columnar_sql`) and fill the
span reader's records (``RankTotals``, the drift series, the memory series); the rules, the memory and
drift analyses and the reports are the span reader's own code. What needs every step as a Python
record (the waiting/transfer split of collective time, the time account and MFU) is computed from the
rows when the window holds at most :data:`DETAIL_ROWS` of them, and otherwise named as not computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.busy_gaps import GapCpu
from traceml_otel.analyze.captures import export_windows, profiled_steps
from traceml_otel.analyze.columnar_recurrence import table_recurrence
from traceml_otel.analyze.columnar_segments import table_segments
from traceml_otel.analyze.columnar_sql import (
    HAS_GPU_TIMING,
    PEAK_SERIES,
    RANK_BUCKETS,
    RANK_SUMS,
    STALL_CANDIDATES,
    STEP_MEDIANS,
    WORST,
    measured_rows,
)
from traceml_otel.analyze.communication_split import split_communication, with_split
from traceml_otel.analyze.diagnose import _accumulation
from traceml_otel.analyze.drift import MAX_POINTS, describe_worst, detect_drift
from traceml_otel.analyze.events import stall_findings, with_recurrence, with_segment
from traceml_otel.analyze.evidence import launcher_first_failure, missing_ranks, run_findings, step_failures
from traceml_otel.analyze.findings import (
    RankCount,
    RankMemory,
    RankMetrics,
    RankSeries,
    RunInfo,
    StepDiagnosis,
    WindowInfo,
)
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.measures import COMPONENTS, RankTotals, rank_metrics, summarize, throughput
from traceml_otel.analyze.memory import memory_analysis
from traceml_otel.analyze.recurrence import StragglerRecurrence, recurrence
from traceml_otel.analyze.rules import diagnose_step_time, straggler_of
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import RankHost, StepTiming, WindowSpec
from traceml_otel.analyze.sources.step_table import step_timing
from traceml_otel.analyze.stalls import (
    SKIP_STEPS,
    STALL_FACTOR,
    STALL_MIN_S,
    STALL_PERCENTILE,
    RankStall,
    StallAnalysis,
    stall_candidate,
    stall_events,
)
from traceml_otel.analyze.startup_steps import with_startup
from traceml_otel.analyze.telemetry_health import confidence_caps
from traceml_otel.analyze.window import StepWindow
from traceml_otel.sanitize import redact_argv
from traceml_otel.wire.capture_record import CaptureSummary
from traceml_otel.wire.cpu_record import CpuRecord
from traceml_otel.wire.export_stats import ExportStats
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.manifest import Manifest
from traceml_otel.wire.step_table import COLUMNS

DETAIL_ROWS = 250_000
"""Largest window whose rows become Python records for the collective split, time account and MFU."""
STALL_ROWS = 4096
"""Stall candidates fetched (the longest): far more than the events kept (``stalls.MAX_EVENTS``)."""
FAILED_ROWS = 40
"""Failed rows fetched beyond each rank's first: enough for ``step_failures``' twenty."""
_ALL = ", ".join(COLUMNS)


def analyze_tables(
    con: Any, source: str, *, service: str = "", run_id: str | None = None, spec: WindowSpec | None = None,
    manifest: Manifest | None = None, export_stats: Sequence[ExportStats] = (), notes: Sequence[str] = (),
    want_steps: bool = False, hangs: Sequence[HangRecord] = (), captures: Sequence[CaptureSummary] = (),
    cpu: Sequence[CpuRecord] = (),
) -> tuple[RunAnalysis, tuple[StepTiming, ...] | None]:
    """Diagnose the run in ``con``'s ``steps`` table; with ``want_steps`` also returns the run's rows as
    records when there are at most :data:`DETAIL_ROWS` of them (``None`` otherwise), for the time
    account. ``hangs``: the ranks' hang records, which turn a stall into a ``HANG`` event with a place.
    Stalls are found in SQL (:data:`~traceml_otel.analyze.columnar_sql.STALL_CANDIDATES`) and their
    steps left out of the window, as the span reader does; so are the steps the run folder's deep
    ``captures`` slowed, where peers wait for them (:func:`_without_captured`). ``cpu``: the ranks' CPU
    samples, which tell a long gap the training thread worked through from a stall (analyze/busy_gaps.py)."""
    chosen, others = _choose_run(con, run_id, manifest.run_id if manifest is not None else None)
    if chosen:
        export_stats = [s for s in export_stats if not s.run_id or s.run_id == chosen]
    ranks, numbers, window_numbers, window_info = _views(con, chosen, spec or WindowSpec())
    stalls = _stalls(con, [h for h in hangs if not h.run_id or not chosen or h.run_id == chosen],
                     [r for r in cpu if not r.run_id or not chosen or r.run_id == chosen])
    selected = len(window_numbers)
    window_numbers = _without_stalled(con, window_numbers, stalls)
    window_numbers = _without_captured(con, window_numbers, captures, chosen)
    if numbers and window_info.first_step == numbers[0]:  # a window from the run's first step
        window_numbers, window_info = _without_startup(con, window_numbers, window_info)
    window_info = replace(window_info, left_out_steps=selected - len(window_numbers))
    clock, parallelism = _clock_and_parallelism(con)
    metrics, detail_notes = _rank_metrics(con, clock, ranks, window_numbers)
    run_steps = None
    if want_steps and _count(con, "r") <= DETAIL_ROWS:
        run_steps = tuple(step_timing(row) for row in con.execute(
            f"SELECT {_ALL} FROM r ORDER BY rank, step").fetchall())
    failed = tuple(step_timing(row) for row in con.execute(
        f"""SELECT {_ALL} FROM (SELECT *, row_number() OVER (PARTITION BY rank ORDER BY step) AS nth,
            row_number() OVER (ORDER BY step, rank) AS overall FROM r WHERE error IS NOT NULL)
            WHERE nth = 1 OR overall <= {FAILED_ROWS} ORDER BY step, rank""").fetchall())
    info = _run_info(con, chosen, source, service, others, manifest, parallelism, [*notes, *detail_notes],
                     failed)
    medians = con.execute(STEP_MEDIANS.format(rows=measured_rows(clock, "a"))).fetchall()
    steps_axis, series = _columns(medians, 2)
    hosts = _hosts(con)
    caps = confidence_caps(export_stats)

    def diagnose_steps(first: int, last: int) -> StepDiagnosis:  # a segment's steps (view ``w``)
        numbers = [n for n in window_numbers if first <= n <= last]
        found, _ = _rank_metrics(con, clock, ranks, numbers,
                                 source=f"(SELECT * FROM w WHERE step BETWEEN {int(first)} AND {int(last)})")
        return diagnose_step_time(found, clock, parallelism, source=source, hosts=hosts, extra_caps=caps)

    segments = table_segments(con, clock, ranks, window_numbers, diagnose_steps)
    reference = segments.primary if len(segments.segments) > 1 else None
    step = (diagnose_steps(reference.first_step, reference.last_step) if reference is not None else
            diagnose_step_time(metrics, clock, parallelism, source=source, hosts=hosts, extra_caps=caps))
    repeated = _recurrence(con, clock, ranks, window_numbers, parallelism)
    step = with_recurrence(step, repeated, lambda rank: _worst(con, clock, rank))
    analysis = RunAnalysis(
        run=info,
        window=window_info,
        clock=clock,
        ranks=metrics,
        summaries=tuple(summarize(metrics, name) for name in COMPONENTS),
        step=step,
        memory=memory_analysis(
            tuple(RankMemory(*row) for row in con.execute(
                "SELECT rank, max(peak_allocated), max(peak_reserved), max(memory_total) FROM w "
                "GROUP BY rank ORDER BY rank").fetchall()),
            *_columns(con.execute(PEAK_SERIES).fetchall(), 2), len(window_numbers),
        ),
        drift=with_segment(detect_drift(steps_axis, series), segments),
        worst_steps=_worst(con, clock),
        series=_rank_series(con, clock, len(numbers)),
        accumulation=_accumulation(metrics),
        run_findings=run_findings(
            world_size=info.world_size, counts=info.rank_steps, failures=info.failures,
            failed_steps=info.failed_steps, exit_code=info.exit_code, export_stats=export_stats,
            steps=(*failed, *_usual_collectives(con)), first_failure=launcher_first_failure(manifest),
        ) + stall_findings(stalls),
        throughput=throughput(metrics),
        hosts=hosts,
        segments=segments,
        stalls=stalls,
        straggler_recurrence=repeated,
    )
    return analysis, run_steps


def _recurrence(con: Any, clock: Clock, ranks: list[int], window_numbers: list[int],
                parallelism: str) -> StragglerRecurrence | None:
    """Straggler recurrence: the span reader's pass on the window's records when they fit in
    :data:`DETAIL_ROWS`, else from per-window SQL sums (``columnar_recurrence.py``)."""
    def rule(found: Sequence[RankMetrics]) -> object:
        return straggler_of(found, parallelism)

    if len(ranks) < 2:
        return None
    if len(window_numbers) * len(ranks) > DETAIL_ROWS:
        return table_recurrence(con, clock, ranks, window_numbers, rule, rank_totals)
    detail = _window_records(con, ranks, window_numbers)

    def metrics_of(sub: StepWindow) -> tuple[RankMetrics, ...]:
        found = tuple(rank_metrics(rank, steps, clock)[0] for rank, steps in zip(sub.ranks, sub.per_rank,
                                                                                  strict=True))
        return with_split(found, split_communication(sub.ranks, sub.per_rank, clock), sub.steps)

    return recurrence(detail, metrics_of, rule)


def _stalls(con: Any, hangs: Sequence[HangRecord], cpu: Sequence[CpuRecord] = ()) -> StallAnalysis:
    """The run's stall events: the candidates from SQL, grouped as the span reader groups them."""
    found = con.execute(STALL_CANDIDATES.format(
        skip=SKIP_STEPS, percentile=STALL_PERCENTILE, factor=STALL_FACTOR, minimum=STALL_MIN_S,
        limit=STALL_ROWS)).fetchall()
    if not found and not hangs:
        return StallAnalysis()
    typical = {(rank, step): (excess, backward) for rank, step, excess, backward in found}
    candidates = []
    if typical:
        con.execute("CREATE OR REPLACE TEMP TABLE stall_keys (rank BIGINT, step BIGINT)")
        con.executemany("INSERT INTO stall_keys VALUES (?, ?)", list(typical))
        for row in con.execute(f"SELECT {', '.join('r.' + c for c in COLUMNS)} FROM r JOIN stall_keys k "
                               "ON r.rank = k.rank AND r.step = k.step WHERE r.error IS NULL").fetchall():
            step = step_timing(row)
            excess, backward = typical[(step.rank, step.step)]
            candidates.append(stall_candidate(step.rank, step, excess, backward or 0.0))
    last_steps = dict(con.execute("SELECT rank, max(step) FROM r GROUP BY rank").fetchall()) if hangs else {}
    busy = None
    if cpu and candidates:
        gap_cpu = GapCpu(cpu)

        def busy(cand: RankStall) -> float | None:  # steps ended before the candidate's: its gap's count
            (ended,) = con.execute("SELECT count(*) FROM r WHERE rank = ? AND step < ?",
                                   [cand.rank, cand.step]).fetchone()
            return gap_cpu.share(cand.rank, int(ended))
    return stall_events(candidates, hangs, last_steps, busy)


def _without_stalled(con: Any, window_numbers: list[int], stalls: StallAnalysis) -> list[int]:
    """The window's step numbers less those a stall interrupted (on any rank), which also leave view
    ``w`` (table ``stalled``)."""
    drop = stalls.stalled_steps()
    if not drop:
        return window_numbers
    con.executemany("INSERT INTO stalled VALUES (?)", [(n,) for n in sorted(drop)])
    return [n for n in window_numbers if n not in drop]


def _without_captured(con: Any, window_numbers: list[int], captures: Sequence[CaptureSummary],
                      run_id: str) -> list[int]:
    """As the span reader (``diagnose.analyze_run``'s ``captured``): the steps a deep capture slowed
    leave the window and view ``w`` (table ``stalled``), unless they are most of it. The
    steps that ran while a trace was written are found in SQL (:func:`~traceml_otel.analyze.captures.
    export_windows`), not by reading every row."""
    mine = [c for c in captures if not c.run_id or not run_id or c.run_id == run_id]
    if not mine:
        return window_numbers
    drop = set(profiled_steps(mine))
    windows = export_windows(mine)
    if windows:
        con.execute("CREATE OR REPLACE TEMP TABLE capture_windows (a DOUBLE, b DOUBLE)")
        con.executemany("INSERT INTO capture_windows VALUES (?, ?)", windows)
        drop.update(row[0] for row in con.execute(
            "SELECT DISTINCT r.step FROM r JOIN capture_windows x ON r.start_unix_nano / 1e9 <= x.b "
            "AND r.start_unix_nano / 1e9 + coalesce(r.traced_cpu, 0.0) >= x.a").fetchall())
    kept = [n for n in window_numbers if n not in drop]
    if len(kept) == len(window_numbers) or len(kept) * 2 < len(window_numbers):
        return window_numbers  # a run made mostly of captured steps keeps them
    con.executemany("INSERT INTO stalled VALUES (?)", [(n,) for n in window_numbers if n in drop])
    return kept


def _without_startup(con: Any, window_numbers: list[int], info: WindowInfo) -> tuple[list[int], WindowInfo]:
    """As the span reader: the leading start-up steps (:func:`~traceml_otel.analyze.startup_steps.
    startup_steps`, on each step's median over ranks, from SQL) leave the window and view ``w``."""
    times = dict(con.execute(
        "SELECT step, median(coalesce(input_wait_cpu, 0.0) + traced_cpu) FROM w WHERE traced_cpu IS NOT NULL "
        "GROUP BY step").fetchall())
    info = with_startup(info, window_numbers, [times.get(n) for n in window_numbers])
    startup = info.startup_steps
    if startup:
        con.executemany("INSERT INTO stalled VALUES (?)", [(n,) for n in window_numbers[:startup]])
    return window_numbers[startup:], info


def _views(con: Any, run_id: str, spec: WindowSpec) -> tuple[list[int], list[int], list[int], WindowInfo]:
    """Views ``r`` (the run), ``a`` (its aligned steps: every rank completed them) and ``w`` (the window),
    as ``window.group_by_rank``, ``aligned_window`` and ``select_window``; returns the ranks with a
    completed step, the aligned step numbers, the window's, and the window's description."""
    quoted = "'" + run_id.replace("'", "''") + "'"
    con.execute(f"CREATE OR REPLACE TEMP VIEW r AS SELECT * FROM steps WHERE coalesce(run_id, '') = {quoted}")
    ranks = [row[0] for row in con.execute(
        "SELECT DISTINCT rank FROM r WHERE error IS NULL ORDER BY rank").fetchall()]
    con.execute(f"""CREATE OR REPLACE TEMP TABLE aligned AS SELECT step FROM r WHERE error IS NULL
                    GROUP BY step HAVING count(DISTINCT rank) = {len(ranks)} ORDER BY step""")
    numbers = [row[0] for row in con.execute("SELECT step FROM aligned ORDER BY step").fetchall()]
    con.execute("CREATE OR REPLACE TEMP VIEW a AS SELECT * FROM r WHERE error IS NULL "
                "AND step IN (SELECT step FROM aligned)")
    window_numbers, window_info = _window(numbers, spec)
    low, high = (window_numbers[0], window_numbers[-1]) if window_numbers else (1, 0)  # contiguous in a
    where = "" if window_numbers == numbers else f" WHERE step BETWEEN {int(low)} AND {int(high)}"
    con.execute("CREATE OR REPLACE TEMP TABLE stalled (step BIGINT)")  # filled by _without_stalled
    stalls_out = "step NOT IN (SELECT step FROM stalled)"
    con.execute(f"CREATE OR REPLACE TEMP VIEW w AS SELECT * FROM a "
                f"{where + ' AND ' if where else ' WHERE '}{stalls_out}")
    return ranks, numbers, window_numbers, window_info


def _rank_metrics(
    con: Any, clock: Clock, ranks: list[int], window_numbers: list[int], source: str = "w",
) -> tuple[tuple[RankMetrics, ...], list[str]]:
    """Each rank's means over the window (from the SQL sums; ``source``: its rows, the view ``w`` or a
    part of it), with the collective split when the window is small enough to pair every rank's steps;
    and a note when it was not."""
    totals = {row[0]: rank_totals(row) for row in con.execute(
        RANK_SUMS.format(rows=measured_rows(clock, source))).fetchall()}
    empty = (0.0,) * 7  # a rank with no aligned step: every mean unavailable, as in rank_metrics
    metrics = tuple((totals.get(rank) or RankTotals(rank, 0, *empty, False, 0.0, 0.0)).means()
                    for rank in ranks)
    window_rows = len(window_numbers) * len(ranks)
    if len(ranks) < 2 or all(m.communication is None for m in metrics):
        return metrics, []
    if window_rows > DETAIL_ROWS:
        return metrics, [f"columnar engine: the waiting/transfer split of collective time is not computed "
                         f"above {DETAIL_ROWS:,} rows (this window: {window_rows:,}); use --engine python "
                         "for it"]
    detail = _window_records(con, ranks, window_numbers, source)
    return with_split(metrics, split_communication(detail.ranks, detail.per_rank, clock), detail.steps), []


def rank_totals(row: Sequence[Any]) -> RankTotals:
    """One row of :data:`~traceml_otel.analyze.columnar_sql.RANK_SUMS` as the span reader's record."""
    (rank, n, step_sum, step_missing, wait, wait_missing, traced, traced_missing, forward, forward_missing,
     backward, backward_missing, optimizer, h2d, h2d_measured, compute, residual, updates, micro,
     samples, samples_steps, tokens, tokens_steps, comm_seen, comm_bytes, comm_calls, total_missing,
     comm_total, comm_missing, comm_sum, between, between_n, skipped) = row
    no_compute = forward_missing or backward_missing
    return RankTotals(
        rank=rank, steps=n,
        step_time=None if step_missing else step_sum or 0.0,
        input_wait=None if wait_missing else wait or 0.0,
        traced=None if traced_missing else traced or 0.0,
        forward=None if forward_missing else forward or 0.0,
        backward=None if backward_missing else backward or 0.0,
        optimizer=optimizer or 0.0, h2d=h2d or 0.0, h2d_measured=bool(h2d_measured),
        compute=None if no_compute else compute or 0.0,
        residual=None if no_compute or traced_missing else residual or 0.0,
        optimizer_updates=None if updates is None else int(updates),
        micro_steps=micro,
        samples=int(samples) if samples_steps else None, tokens=int(tokens) if tokens_steps else None,
        samples_steps=samples_steps, tokens_steps=tokens_steps,
        communication=None if comm_missing or not comm_seen else comm_sum or 0.0,
        communication_total=None if total_missing or not comm_seen else comm_total or 0.0,
        communication_bytes=int(comm_bytes or 0) if comm_seen else None,
        communication_calls=int(comm_calls or 0) if comm_seen else None,
        communication_measured=bool(comm_seen),
        between_steps=between if between_n else None, between_steps_counted=between_n,
        skipped_updates=int(skipped or 0),
    )


def _choose_run(con: Any, run_id: str | None, preferred: str | None) -> tuple[str, tuple[str, ...]]:
    """As the span reader: the run asked for, else the manifest's, else the one with most steps."""
    found = [row[0] or "" for row in con.execute(
        "SELECT run_id FROM steps GROUP BY run_id ORDER BY count(*) DESC, run_id").fetchall()]
    chosen = run_id if run_id is not None else preferred if preferred in found else found[0] if found else ""
    return chosen, tuple(r for r in found if r != chosen)


def _window(numbers: list[int], spec: WindowSpec) -> tuple[list[int], WindowInfo]:
    """``window.select_window`` on step numbers."""
    requested = ""
    chosen = numbers
    if spec.last is not None:
        chosen = numbers[-spec.last:]
        requested = f"last {spec.last} steps"
    elif spec.mode == "range":
        low = spec.first_step if spec.first_step is not None else -1
        high = spec.last_step if spec.last_step is not None else 1 << 62
        chosen = [n for n in numbers if low <= n <= high]
        requested = f"steps {spec.first_step if spec.first_step is not None else ''}:" + (
            f"{spec.last_step}" if spec.last_step is not None else "")
    return chosen, WindowInfo(spec.mode, chosen[0] if chosen else None, chosen[-1] if chosen else None,
                              len(chosen), requested)


def _clock_and_parallelism(con: Any) -> tuple[Clock, str]:
    """``window.select_clock`` and ``window.window_parallelism`` over ``w``."""
    rows, gpu = con.execute(f"SELECT count(*), bool_and({HAS_GPU_TIMING}) FROM w").fetchone()
    clock = Clock.GPU if rows and gpu else Clock.CPU
    seen = dict(con.execute("SELECT parallelism, count(*) FROM w GROUP BY parallelism").fetchall())
    if "fsdp" in seen:
        return clock, "fsdp"
    return clock, max(seen, key=lambda name: seen[name]) if seen else "none"


def _window_records(con: Any, ranks: list[int], numbers: list[int], source: str = "w") -> StepWindow:
    rows = con.execute(f"SELECT {_ALL} FROM {source} ORDER BY rank, step").fetchall()
    per_rank: dict[int, list[StepTiming]] = {rank: [] for rank in ranks}
    for row in rows:
        step = step_timing(row)
        per_rank[step.rank].append(step)
    return StepWindow(tuple(ranks), tuple(numbers), tuple(tuple(per_rank[r]) for r in ranks))


def _count(con: Any, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(width)]


def _worst(con: Any, clock: Clock, rank: int | None = None) -> tuple[Any, ...]:
    """The window's slowest (rank, step) records, as ``drift.worst_steps``; ``rank``: that rank's only."""
    rows = "w" if rank is None else f"(SELECT * FROM w WHERE rank = {int(rank)})"
    found = con.execute(f"""
        SELECT {", ".join(f"w.{name}" for name in COLUMNS)}, x.seconds FROM w
        JOIN ({WORST.format(rows=measured_rows(clock, rows), count=t.WORST_STEPS)}) x
            ON w.rank = x.rank AND w.step = x.step
        ORDER BY x.seconds DESC, w.rank DESC, w.step DESC""").fetchall()
    return tuple(describe_worst(step_timing(row[:-1]), row[-1], clock) for row in found)


def _rank_series(con: Any, clock: Clock, steps: int) -> tuple[RankSeries, ...]:
    size = max(1, -(-steps // MAX_POINTS))
    grouped: dict[int, list[tuple[int, float, int | None]]] = {}
    for rank, first, seconds, peak in con.execute(
            RANK_BUCKETS.format(rows=measured_rows(clock, "a"), size=size)).fetchall():
        grouped.setdefault(rank, []).append((first, seconds, peak))
    ranks = [row[0] for row in con.execute("SELECT DISTINCT rank FROM a ORDER BY rank").fetchall()]
    return tuple(RankSeries(rank, *(tuple(col) for col in _columns(grouped.get(rank, []), 3)))
                 if rank in grouped else RankSeries(rank, (), (), ()) for rank in ranks)


def _hosts(con: Any) -> tuple[RankHost, ...]:
    """``StepAssembler.hosts``: per rank, the last CPU count and loader settings recorded."""
    rows = con.execute("""
        SELECT rank, arg_max(host_cpus, step) FILTER (WHERE host_cpus IS NOT NULL),
            arg_max([loader_num_workers, loader_prefetch_factor, loader_batch_size], step)
                FILTER (WHERE loader_num_workers IS NOT NULL),
            arg_max([loader_pin_memory, loader_persistent_workers], step)
                FILTER (WHERE loader_num_workers IS NOT NULL),
            arg_max(loader_dataset, step) FILTER (WHERE loader_num_workers IS NOT NULL)
        FROM r WHERE host_cpus IS NOT NULL OR loader_num_workers IS NOT NULL
        GROUP BY rank ORDER BY rank""").fetchall()
    hosts = []
    for rank, cpus, numbers, flags, dataset in rows:
        if numbers is None:
            hosts.append(RankHost(rank, cpus))
        else:
            hosts.append(RankHost(rank, cpus, numbers[0], flags[0], flags[1], numbers[1], numbers[2],
                                  dataset))
    return tuple(hosts)


def _usual_collectives(con: Any) -> tuple[StepTiming, ...]:
    """Per rank with a failed step, one record of its completed steps' most collective calls and bytes
    (all ``evidence.extra_collective`` reads of them)."""
    return tuple(StepTiming("", rank, -1, comm_calls=calls, comm_bytes=nbytes) for rank, calls, nbytes in
                 con.execute("""SELECT rank, max(coalesce(comm_calls, 0)), max(coalesce(comm_bytes, 0)) FROM r
                                WHERE error IS NULL AND rank IN (SELECT rank FROM r WHERE error IS NOT NULL)
                                GROUP BY rank""").fetchall())


def _run_info(
    con: Any, run_id: str, source: str, service: str, others: tuple[str, ...], manifest: Manifest | None,
    parallelism: str, notes: Sequence[str], failed: Sequence[StepTiming],
) -> RunInfo:
    """``diagnose._run_info`` from the table."""
    world, rows, failed_count = con.execute(
        "SELECT max(world_size), count(*), count(error) FROM r").fetchone()
    spans = con.execute("SELECT sum(spans) FROM steps").fetchone()[0]  # every run's, as the span reader
    world_size = world if world is not None else (manifest.world_size if manifest else None)
    counts = tuple(RankCount(*row) for row in con.execute(
        "SELECT rank, count(*), min(step), max(step) FROM r GROUP BY rank ORDER BY rank").fetchall())
    observed = tuple(c.rank for c in counts)
    sources = Counter(dict(con.execute(
        "SELECT source, count(*) FROM r WHERE source IS NOT NULL AND source <> '' "
        "GROUP BY source").fetchall()))
    warnings = list(notes)
    if others:
        warnings.append(f"{len(others) + 1} runs found; analysing {run_id or '(no run id)'} "
                        f"(choose with --run-id: {', '.join(others[:5])})")
    return RunInfo(
        run_id=run_id or (manifest.run_id if manifest else ""),
        source=source,
        service=service,
        world_size=world_size,
        ranks=observed,
        parallelism=parallelism,
        command=" ".join(redact_argv(list(manifest.command))) if manifest else "",
        start_time=manifest.start_time if manifest else None,
        end_time=manifest.end_time if manifest else None,
        exit_code=manifest.exit_code if manifest else None,
        spans_read=int(spans or 0),
        steps_read=rows,
        failed_steps=failed_count,
        other_run_ids=others,
        warnings=tuple(warnings),
        warnings_total=len(warnings),
        missing_ranks=missing_ranks(world_size, observed),
        rank_steps=counts,
        failures=step_failures(failed),
        step_sources=tuple(name for name, _ in sources.most_common()),
    )


def with_detail_note(analysis: RunAnalysis, note: str) -> RunAnalysis:
    """``analysis`` with one more input warning (said by the pipeline about what was not computed)."""
    run = analysis.run
    return replace(analysis, run=replace(run, warnings=(*run.warnings, note),
                                         warnings_total=run.warnings_total + 1))
