"""Turn a loaded run into a :class:`~traceml_otel.analyze.findings.RunAnalysis`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace

from traceml_otel.analyze.busy_gaps import GapCpu
from traceml_otel.analyze.communication_split import split_communication, with_split
from traceml_otel.analyze.drift import detect_drift, rank_series, step_series, worst_steps
from traceml_otel.analyze.events import median_series, stall_findings, with_recurrence, with_segment
from traceml_otel.analyze.evidence import (
    launcher_first_failure,
    missing_ranks,
    rank_counts,
    run_findings,
    step_failures,
)
from traceml_otel.analyze.findings import Accumulation, RankMetrics, RunInfo, StepDiagnosis, WorstStep
from traceml_otel.analyze.measures import COMPONENTS, rank_metrics, summarize, throughput
from traceml_otel.analyze.memory import diagnose_memory
from traceml_otel.analyze.recurrence import recurrence
from traceml_otel.analyze.rules import diagnose_step_time, straggler_of
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import LoadedRun, StepTiming, WindowSpec
from traceml_otel.analyze.segments import reference_window, segment_window
from traceml_otel.analyze.stalls import find_stalls
from traceml_otel.analyze.startup_steps import step_times, with_startup
from traceml_otel.analyze.telemetry_health import confidence_caps
from traceml_otel.analyze.window import (
    StepWindow,
    aligned_window,
    group_by_rank,
    select_clock,
    select_window,
    window_parallelism,
    without_steps,
)
from traceml_otel.sanitize import redact_argv
from traceml_otel.wire.cpu_record import CpuRecord
from traceml_otel.wire.export_stats import ExportStats
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.manifest import Manifest


def analyze_run(
    loaded: LoadedRun, spec: WindowSpec | None = None, manifest: Manifest | None = None,
    export_stats: Sequence[ExportStats] = (), notes: Sequence[str] = (), hangs: Sequence[HangRecord] = (),
    captured: Collection[int] = (), cpu: Sequence[CpuRecord] = (),
) -> RunAnalysis:
    """Diagnose ``loaded`` over the window ``spec`` (default: the whole run).

    ``hangs``: the ranks' hang records (run directory), which turn a stall into a ``HANG`` event with a place.
    ``cpu``: the ranks' CPU samples, which tell a long gap between steps the training thread worked
    through (unmarked evaluation) from a stall (analyze/busy_gaps.py).
    ``captured``: the steps a deep capture profiled (on any rank): the profiler slowed them, so they are
    left out of the per-step means as stalls are (never a straggler made by our own capture).

    ``export_stats``: the emitters' records from the run directory (none for a backend source);
    ``notes``: problems reading the run directory's records, shown with the input warnings.
    """
    if loaded.run_id:  # a folder may hold another run's leftovers
        export_stats = [s for s in export_stats if not s.run_id or s.run_id == loaded.run_id]
    spec = spec or WindowSpec()
    by_rank = group_by_rank(loaded.steps)
    run = aligned_window(by_rank)
    window, window_info = select_window(run, spec)
    gap_cpu = GapCpu([r for r in cpu if not r.run_id or r.run_id == loaded.run_id]) if cpu else None
    every_step = StepWindow(tuple(by_rank), (), tuple(tuple(s) for s in by_rank.values()))
    stalls = find_stalls(every_step, hangs, gap_cpu)
    selected = window.steps
    window = without_steps(window, stalls.stalled_steps())  # stalls are events, never in a per-step mean
    kept = without_steps(window, captured)  # our own profiler slowed these, never the user's code
    if kept.steps * 2 >= window.steps:  # a run made mostly of captured steps keeps them
        window = kept
    starts_the_run = bool(run.step_numbers) and window_info.first_step == run.step_numbers[0]
    if starts_the_run:  # a compile, first allocations: never the run's typical step
        window_info = with_startup(window_info, window.step_numbers, step_times(window))
        window = without_steps(window, window.step_numbers[:window_info.startup_steps])
    window_info = replace(window_info, left_out_steps=selected - window.steps)
    clock = select_clock(window)
    parallelism = window_parallelism(window)

    measured = [
        rank_metrics(rank, steps, clock) for rank, steps in zip(window.ranks, window.per_rank, strict=True)
    ]
    ranks = with_split(
        tuple(metrics for metrics, _ in measured),
        split_communication(window.ranks, window.per_rank, clock),
        window.steps,
    )
    window_seconds = [seconds for _, seconds in measured]

    def metrics_of(sub: StepWindow) -> tuple[RankMetrics, ...]:
        found = tuple(rank_metrics(rank, steps, clock)[0]
                      for rank, steps in zip(sub.ranks, sub.per_rank, strict=True))
        return with_split(found, split_communication(sub.ranks, sub.per_rank, clock), sub.steps)

    caps = confidence_caps(export_stats)

    done: dict[tuple[int, int], StepDiagnosis] = {}

    def diagnose(sub: StepWindow) -> StepDiagnosis:  # a segment's, then the reference's again: once
        key = (sub.step_numbers[0] if sub.step_numbers else -1, sub.steps)
        if key not in done:
            done[key] = diagnose_step_time(metrics_of(sub), clock, parallelism, source=loaded.source,
                                           hosts=loaded.hosts, extra_caps=caps)
        return done[key]

    segments = segment_window(window, median_series(window_seconds), clock, diagnose)
    reference = reference_window(window, segments)
    step = diagnose(reference) if reference is not window else diagnose_step_time(
        ranks, clock, parallelism, source=loaded.source, hosts=loaded.hosts, extra_caps=caps)
    repeated = recurrence(window, metrics_of, lambda found: straggler_of(found, parallelism))
    def rank_worst(rank: int) -> tuple[WorstStep, ...]:  # one rank's slowest steps
        i = window.ranks.index(rank)
        return worst_steps(StepWindow((rank,), window.step_numbers, (window.per_rank[i],)),
                           [window_seconds[i]], clock)

    step = with_recurrence(step, repeated, rank_worst)
    run_seconds = (
        window_seconds
        if window is run
        else [
            rank_metrics(rank, steps, clock)[1] for rank, steps in zip(run.ranks, run.per_rank, strict=True)
        ]
    )
    steps, series = step_series(run.step_numbers, run_seconds)
    charts = tuple(
        rank_series(rank, rank_steps, seconds)
        for rank, rank_steps, seconds in zip(run.ranks, run.per_rank, run_seconds, strict=True)
    )
    info = _run_info(loaded, manifest, parallelism, notes)
    from traceml_otel.analyze.compare_noise import run_noise

    noise = run_noise(*step_series(window.step_numbers, window_seconds))
    return RunAnalysis(
        run=info,
        window=window_info,
        clock=clock,
        ranks=ranks,
        summaries=tuple(summarize(ranks, name) for name in COMPONENTS),
        step=step,
        memory=diagnose_memory(window),
        drift=with_segment(detect_drift(steps, series), segments),
        worst_steps=worst_steps(window, window_seconds, clock),
        series=charts,
        accumulation=_accumulation(ranks),
        run_findings=run_findings(
            world_size=info.world_size, counts=info.rank_steps, failures=info.failures,
            failed_steps=info.failed_steps, exit_code=info.exit_code, export_stats=export_stats,
            steps=loaded.steps, first_failure=launcher_first_failure(manifest),
        ) + stall_findings(stalls),
        throughput=throughput(ranks),
        hosts=loaded.hosts,
        noise=noise,
        segments=segments,
        stalls=stalls,
        straggler_recurrence=repeated,
    )


def _accumulation(ranks: tuple[RankMetrics, ...]) -> Accumulation:
    """Optimizer updates and micro-steps of the median rank (ranks agree in data-parallel runs)."""
    known = sorted(
        (m for m in ranks if m.optimizer_updates is not None), key=lambda m: m.optimizer_updates or 0
    )
    if not known:
        micro = max((m.micro_steps for m in ranks), default=0)
        return Accumulation(None, micro, None)
    middle = known[len(known) // 2]
    updates = middle.optimizer_updates or 0
    # steps per update over the steps that tried one: a skipped update is no accumulation
    per_update = (middle.steps - middle.skipped_updates) / updates if updates else None
    return Accumulation(updates, middle.micro_steps, per_update, middle.skipped_updates)


def _run_info(
    loaded: LoadedRun, manifest: Manifest | None, parallelism: str, notes: Sequence[str]
) -> RunInfo:
    sizes = [s.world_size for s in loaded.steps if s.world_size is not None]
    world_size = max(sizes) if sizes else (manifest.world_size if manifest else None)
    counts = rank_counts(loaded.steps)
    observed = tuple(c.rank for c in counts)
    warnings = [*notes, *loaded.warnings]
    if loaded.orphan_steps:
        warnings.append(f"{loaded.orphan_steps} (rank, step) pairs had phase spans but no traceml.step span")
    return RunInfo(
        run_id=loaded.run_id or (manifest.run_id if manifest else ""),
        source=loaded.source,
        service=loaded.service,
        world_size=world_size,
        ranks=observed,
        parallelism=parallelism,
        command=" ".join(redact_argv(list(manifest.command))) if manifest else "",  # older or other writers
        start_time=manifest.start_time if manifest else None,
        end_time=manifest.end_time if manifest else None,
        exit_code=manifest.exit_code if manifest else None,
        spans_read=loaded.spans_read,
        steps_read=len(loaded.steps),
        failed_steps=sum(1 for s in loaded.steps if s.error is not None),
        other_run_ids=loaded.other_run_ids,
        warnings=tuple(warnings),
        warnings_total=loaded.warnings_total + (1 if loaded.orphan_steps else 0) + len(notes),
        missing_ranks=missing_ranks(world_size, observed),
        rank_steps=counts,
        failures=step_failures(loaded.steps),
        step_sources=_step_sources(loaded.steps),
    )


def _step_sources(steps: Sequence[StepTiming]) -> tuple[str, ...]:
    """``traceml.step.source`` values, most steps first (spans from before the attribute: none)."""
    counts = Counter(s.source for s in steps if s.source)
    return tuple(source for source, _ in counts.most_common())
