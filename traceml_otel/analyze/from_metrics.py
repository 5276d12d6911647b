"""Diagnose a run from metric totals (``traceml analyze --prometheus``).

The engine sums; this module turns each rank's sums into the same :class:`RankTotals` the span
reader builds, and the same rules decide. What metrics cannot tell, and how it is approximated:

- Coverage is per call, not per step: a phase counts as measured on a rank when it has at least
  one call per step, the input wait when every step measured one.
- The exposed collective time inside a phase is not a metric: DDP's (source ``ddp``) gradient wait
  is taken out of backward, where DDP waits; other collectives are taken as outside the phases.
- The residual is the rank's total block time minus its phase and exposed collective totals
  (the span reader floors each step's residual at 0 before summing).
- Waiting and transfer are split clock-free, on the means: the least exposed rank waited for
  nobody, so its exposed time is the transfer (``communication_rules.py``); the collective call and
  byte counters give the regime (latency or bandwidth).
- Loader-side prefetch copies, optimizer updates and device memory totals are not metrics; the
  clock is GPU when CUDA memory gauges exist, else CPU; the parallelism is inferred from the
  collectives seen (:func:`infer_parallelism`).
- The time between steps is the wall time between the first and the last step end seen in the
  range, less the traced time of the steps ended in between (it includes ``outside_step`` blocks,
  which the span attribute leaves out).
- Drift is read per time bucket: each bucket's mean step time stands for every step done in it
  (:func:`per_step_series`), so the drift rule sees the run's steps on the span reader's step axis
  (its minimum of 50 steps, warm-up and bands are counted in steps, not buckets); step numbers of
  the slowest steps are unknown (the trace ids of the slowest sampled steps come from exemplars when
  the engine keeps them).
"""

from __future__ import annotations

from traceml_otel import contract as c
from traceml_otel.analyze.drift import detect_drift
from traceml_otel.analyze.evidence import missing_ranks, run_findings
from traceml_otel.analyze.findings import (
    Accumulation,
    DriftAnalysis,
    RankCount,
    RankMemory,
    RunInfo,
    WindowInfo,
)
from traceml_otel.analyze.kinds import Clock, DriftKind
from traceml_otel.analyze.measures import (
    COMPONENTS,
    RankTotals,
    compute_time,
    residual_time,
    summarize,
    throughput,
)
from traceml_otel.analyze.memory import memory_analysis
from traceml_otel.analyze.metric_ends import end_findings
from traceml_otel.analyze.rules import diagnose_step_time
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.sources.prometheus import MetricRun, RankCounters

FORWARD, BACKWARD, OPTIMIZER, H2D = (c.PHASES.index(p) for p in ("forward", "backward", "optimizer", "h2d"))
DDP_SOURCE = "ddp"
MAX_DRIFT_STEPS = 100_000
"""Steps the drift series holds at most: beyond it each point stands for several steps."""
NOT_FROM_METRICS = (
    "from metrics: step numbers, per-step detail and per-rank charts are not available (use the spans "
    "for them); phase coverage is per call, not per step"
)


def rank_totals(counters: RankCounters) -> RankTotals:
    """One rank's :class:`RankTotals` from the engine's sums (see the module notes)."""
    steps = round(counters.steps)
    calls, times = counters.phase_calls, counters.phase_time

    def per_step(index: int) -> float | None:
        return times[index] if calls[index] >= steps > 0 else None

    forward, backward = per_step(FORWARD), per_step(BACKWARD)
    exposed = dict(counters.exposed_by_source)
    communication = sum(exposed.values()) if exposed else None
    if backward is not None and DDP_SOURCE in exposed:
        backward = max(0.0, backward - exposed[DDP_SOURCE])
    optimizer, h2d = times[OPTIMIZER], times[H2D]
    compute = compute_time(forward, backward, optimizer)
    wait = counters.input_wait if counters.input_wait_steps >= steps > 0 else None
    measured = communication is not None or counters.collective_time is not None
    return RankTotals(
        rank=counters.rank,
        steps=steps,
        step_time=None if wait is None else wait + counters.traced,
        input_wait=wait,
        traced=counters.traced,
        forward=forward,
        backward=backward,
        optimizer=optimizer,
        h2d=h2d,
        h2d_measured=calls[H2D] > 0,
        compute=compute,
        residual=(
            None if compute is None else residual_time(counters.traced, h2d, compute, communication or 0.0)
        ),
        samples=counters.samples,
        tokens=counters.tokens,
        communication=communication if measured else None,
        communication_total=counters.collective_time,
        communication_measured=measured,
        communication_calls=counters.collective_calls if measured else None,
        communication_bytes=counters.collective_bytes if measured else None,
        between_steps=counters.between_steps,
        between_steps_counted=round(counters.between_steps_counted),
    )


def infer_parallelism(ranks: tuple[RankCounters, ...]) -> str:
    """``ddp`` when DDP's gradient collectives were timed; ``independent`` when several ranks never
    showed a collective (processes with no process group); else ``none``. Metrics carry no
    parallelism label, so a DDP run with collective timing off reads as ``independent``."""
    sources = {source for r in ranks for source, _ in r.exposed_by_source}
    sources.update(source for r in ranks for source in r.collective_sources)
    if DDP_SOURCE in sources:
        return "ddp"
    return "independent" if len(ranks) > 1 and not sources else "none"


def analyze_metrics(run: MetricRun, window: str = "") -> RunAnalysis:
    """Diagnose ``run`` with the span reader's rules; ``window``: the time range, for the report."""
    ranks = tuple(rank_totals(counters).means() for counters in run.ranks)
    gpu = any(r.peak_allocated is not None or r.peak_reserved is not None for r in run.ranks)
    clock = Clock.GPU if gpu else Clock.CPU
    parallelism = infer_parallelism(run.ranks)
    counts = tuple(RankCount(m.rank, m.steps, 0, max(m.steps - 1, 0)) for m in ranks)
    observed = tuple(m.rank for m in ranks)
    warnings = (*run.warnings, NOT_FROM_METRICS, *_between_steps_line(run), *_exemplar_lines(run))
    info = RunInfo(
        run_id=run.run_id, source=run.source, world_size=run.ends.world_size or len(ranks) or None,
        ranks=observed, parallelism=parallelism, steps_read=sum(m.steps for m in ranks), warnings=warnings,
        warnings_total=len(warnings), missing_ranks=missing_ranks(run.ends.world_size, observed),
        rank_steps=counts,
    )
    steps = min((m.steps for m in ranks), default=0)
    memory_ranks = tuple(
        RankMemory(r.rank, _int(r.peak_allocated), _int(r.peak_reserved), None) for r in run.ranks
    )
    return RunAnalysis(
        run=info,
        window=WindowInfo("time", None, None, steps, window),
        clock=clock,
        ranks=ranks,
        summaries=tuple(summarize(ranks, name) for name in COMPONENTS),
        step=diagnose_step_time(ranks, clock, parallelism, source=run.source),
        memory=memory_analysis(memory_ranks, run.memory_worst, run.memory_median, steps),
        drift=_drift(run),
        worst_steps=(),
        series=(),
        accumulation=Accumulation(None, 0, None),
        run_findings=(*end_findings(run.ends), *run_findings(
            world_size=run.ends.world_size, counts=counts, failures=(), failed_steps=0, exit_code=None
        )),
        throughput=throughput(ranks),
    )


def _drift(run: MetricRun) -> DriftAnalysis:
    if not run.step_time_series:
        return DriftAnalysis(DriftKind.NOT_ENOUGH_STEPS)
    steps, series, buckets = per_step_series(run.step_points, run.step_time_series)
    return detect_drift(steps, series, buckets)


def per_step_series(
    done: tuple[int, ...] | list[int], means: tuple[float, ...] | list[float], limit: int = MAX_DRIFT_STEPS,
) -> tuple[list[int], list[float], list[int]]:
    """The drift's step axis from time buckets: ``done[i]`` steps were done by the end of bucket ``i``
    (median over ranks) and ``means[i]`` is the bucket's mean step time; each step done in a bucket
    gets its mean, numbered as the span reader numbers steps (from 0), and the bucket's index (the
    drift's noise is judged over buckets, the independent values). A bucket with no step done adds
    none. Beyond ``limit`` steps each point stands for ``ceil(steps / limit)`` steps (bounded memory)."""
    total = max(done, default=0)
    stride = max(1, -(-total // limit))
    steps: list[int] = []
    series: list[float] = []
    buckets: list[int] = []
    previous = 0
    for bucket, (count, mean) in enumerate(zip(done, means, strict=False)):
        for number in range(previous + (-previous) % stride, count, stride):
            steps.append(number)
            series.append(mean)
            buckets.append(bucket)
        previous = max(previous, count)
    return steps, series, buckets


def _between_steps_line(run: MetricRun) -> tuple[str, ...]:
    """Why the time between steps is unknown on some rank, when it is (and no fetch was timed)."""
    unknown = [r.rank for r in run.ranks if r.between_steps is None and r.input_wait_steps < r.steps]
    if not unknown:
        return ()
    return (f"time between steps: not known from metrics on {len(unknown)} rank(s) (first: rank "
            f"{unknown[0]}): fewer than two scrapes saw their steps (a run shorter than the scrape "
            "interval)",)


def _exemplar_lines(run: MetricRun) -> tuple[str, ...]:
    if not run.exemplars:
        where = "the engine keeps no exemplars" if run.exemplars_queried else "exemplars could not be read"
        return (f"slowest steps' trace ids: not available from metrics ({where}; Prometheus keeps them with "
                "--enable-feature=exemplar-storage)",)
    slow = "; ".join(
        f"rank {e.rank if e.rank is not None else '?'} {e.seconds:.3g} s trace {e.trace_id}"
        for e in run.exemplars
    )
    return (f"slowest sampled steps (exemplars): {slow}",)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
