"""Per-step and per-rank numbers on one clock, and their summaries across ranks.

Formulas (diagnosis-semantics): ``step_time = input_wait + traced`` (plus loader-side prefetch
copies, which are neither), ``compute = forward + backward + optimizer`` and per step
``residual = max(0, traced - h2d - compute - communication)``. Where collectives were timed,
``communication`` is their exposed time, and forward, backward and optimizer exclude the part of
it measured inside them (DDP's gradient wait sits at the end of backward). Input wait, forward,
backward and traced time must be present on every step of a rank or that rank's metric is
``None``. Optimizer and h2d are occurrence metrics: a step without them counts 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from traceml_otel.analyze.findings import MetricSummary, RankMetrics, SignalCoverage, Throughput
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import BACKWARD, FORWARD, H2D, OPTIMIZER, StepTiming

COMPONENTS = (
    "input_wait",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "residual",
    "compute",
    "traced",
    "step_time",
)
"""Summary names, in report order."""


def step_parts(step: StepTiming, gpu: bool) -> tuple[float | None, float | None, float | None, float | None,
                                                     float, float, float, float | None]:
    """One step's parts on one clock, read once for every formula below: (input wait, traced,
    forward, backward, optimizer, h2d, h2d inside the block, exposed communication).

    Where the step's collectives were measured, the waits measured inside forward, backward and the
    optimizer are communication, not that phase's compute, and are taken out of them. ``h2d`` adds
    the loader-side prefetch copies to the copies inside the block. Communication is 0 in a step
    without collectives and ``None`` where they were not measured. A plain tuple: this runs once per
    step of a run (:func:`rank_metrics`).
    """
    times = step.phase_gpu if gpu else step.phase_cpu
    forward, backward = times[FORWARD], times[BACKWARD]
    optimizer, h2d_in = times[OPTIMIZER] or 0.0, times[H2D] or 0.0
    exposed: float | None = 0.0
    if step.comm_calls is not None:
        exposed = step.comm_exposed_gpu if gpu else step.comm_exposed_cpu
        if exposed is not None:
            inside = step.phase_comm_gpu if gpu else step.phase_comm_cpu
            forward = None if forward is None else max(0.0, forward - inside[FORWARD])
            backward = None if backward is None else max(0.0, backward - inside[BACKWARD])
            optimizer = max(0.0, optimizer - inside[OPTIMIZER])
    return (step.input_wait_gpu if gpu else step.input_wait_cpu, step.traced_gpu if gpu else step.traced_cpu,
            forward, backward, optimizer, h2d_in + (step.h2d_before_cpu or 0.0), h2d_in, exposed)


def step_time(input_wait: float | None, traced: float | None, h2d: float, h2d_in_step: float) -> float | None:
    """Input wait + traced block + loader-side copies (``h2d`` outside the block); ``None`` if a part
    is missing."""
    if input_wait is None or traced is None:
        return None
    return input_wait + traced + (h2d - h2d_in_step)


def compute_time(forward: float | None, backward: float | None, optimizer: float) -> float | None:
    """Forward + backward + optimizer; ``None`` without forward or backward."""
    if forward is None or backward is None:
        return None
    return forward + backward + optimizer


def residual_time(traced: float, h2d_in_step: float, compute: float, communication: float) -> float:
    """Time inside the block outside the phases and the exposed collectives (never below 0).

    The one definition of the residual: per step for spans, over a rank's totals for metrics.
    """
    return max(0.0, traced - h2d_in_step - compute - communication)


@dataclass(frozen=True, slots=True)
class StepValues:
    """One step's components on the window clock; ``None`` where not measured.

    Built for single steps (the slowest ones, tests); whole-run passes use :func:`rank_metrics`. Both
    read a step with :func:`step_parts` and apply the same formulas.
    """

    step: int
    rank: int
    trace_id: str
    input_wait: float | None
    traced: float | None
    forward: float | None
    backward: float | None
    optimizer: float
    h2d: float
    h2d_in_step: float
    communication: float | None = 0.0

    @property
    def step_time(self) -> float | None:
        """Input wait + traced block + loader-side copies, or ``None`` if a part is missing."""
        return step_time(self.input_wait, self.traced, self.h2d, self.h2d_in_step)

    @property
    def compute(self) -> float | None:
        return compute_time(self.forward, self.backward, self.optimizer)

    @property
    def residual(self) -> float | None:
        compute = self.compute
        if compute is None or self.traced is None:
            return None
        return residual_time(self.traced, self.h2d_in_step, compute, self.communication or 0.0)


def step_values(step: StepTiming, clock: Clock) -> StepValues:
    """Read one step's components on ``clock``."""
    return StepValues(step.step, step.rank, step.trace_id, *step_parts(step, clock is Clock.GPU))


@dataclass(frozen=True, slots=True)
class RankTotals:
    """Sums over one rank's steps on one clock, from which :class:`RankMetrics` means are taken.

    Filled by the span reader (:func:`rank_metrics`) and by the metric sources (sums pushed down to
    the engine), so both share one definition of each mean. ``None``: a required signal was missing
    on some step (the mean is then unavailable, never 0).
    """

    rank: int
    steps: int
    step_time: float | None
    input_wait: float | None
    traced: float | None
    forward: float | None
    backward: float | None
    optimizer: float
    h2d: float
    h2d_measured: bool
    compute: float | None
    residual: float | None
    optimizer_updates: int | None = None
    micro_steps: int = 0
    samples: float | None = None
    tokens: float | None = None
    communication: float | None = None
    communication_total: float | None = None
    communication_bytes: float | None = None
    communication_measured: bool = False
    samples_steps: float | None = None
    """Steps that recorded a sample count (``None``: every step, as a counter's total implies)."""
    tokens_steps: float | None = None
    communication_calls: float | None = None
    between_steps: float | None = None
    """Sum of the time between steps over the ``between_steps_counted`` steps that recorded it."""
    between_steps_counted: float = 0
    skipped_updates: int = 0

    def means(self) -> RankMetrics:
        """Per-step means of these totals."""
        n = self.steps

        def mean(total: float | None) -> float | None:
            return None if total is None or n == 0 else total / n

        return RankMetrics(
            rank=self.rank,
            steps=n,
            step_time=mean(self.step_time),
            input_wait=mean(self.input_wait),
            traced=mean(self.traced),
            forward=mean(self.forward),
            backward=mean(self.backward),
            optimizer=self.optimizer / n if n else 0.0,
            h2d=self.h2d / n if n else 0.0,
            h2d_measured=self.h2d_measured,
            compute=mean(self.compute),
            residual=mean(self.residual),
            optimizer_updates=self.optimizer_updates,
            micro_steps=self.micro_steps,
            samples_per_step=_work_per_step(self.samples, self.samples_steps, n),
            tokens_per_step=_work_per_step(self.tokens, self.tokens_steps, n),
            work_steps=(n if self.samples_steps is None and self.samples is not None
                        else round(self.samples_steps or 0)),  # weighted on a sampled source
            communication=mean(self.communication),
            communication_total=mean(self.communication_total),
            communication_bytes=mean(self.communication_bytes),
            communication_calls=mean(self.communication_calls),
            communication_measured=self.communication_measured,
            between_steps=(self.between_steps / self.between_steps_counted
                           if self.between_steps is not None and self.between_steps_counted else None),
            skipped_updates=self.skipped_updates,
        )


def rank_metrics(
    rank: int, steps: Sequence[StepTiming], clock: Clock
) -> tuple[RankMetrics, list[float | None]]:
    """Means of one rank's steps, and each step's step time (its traced time where input wait is missing).

    One pass over the steps (this runs over every step of a run). A required signal missing on
    any step makes its mean ``None``. Steps of a sampled source count by their ``weight`` (``1/p``):
    the means are inverse-probability (Horvitz-Thompson ratio) means, the step count the steps read.
    """
    gpu = clock is Clock.GPU
    n = len(steps)
    wait_sum = traced_sum = forward_sum = backward_sum = optimizer_sum = h2d_sum = 0.0
    compute_sum = residual_sum = step_sum = 0.0
    wait_missing = traced_missing = forward_missing = backward_missing = step_missing = False
    seconds: list[float | None] = []
    h2d_measured = False
    updates: int | None = None
    micro = skipped = 0
    # counts and byte sums stay ints while unweighted (w = 1), floats on a sampled source
    samples_sum: float = 0
    tokens_sum: float = 0
    samples_steps: float = 0
    tokens_steps: float = 0
    comm_sum, comm_total = 0.0, 0.0
    comm_bytes: float = 0
    comm_calls: float = 0
    comm_missing = total_missing = comm_seen = False
    between_sum = 0.0
    between_n: float = 0
    scale = _weight_scale(steps)
    w: float = 1  # an int while unweighted: the counts and byte sums stay ints
    for s in steps:
        if scale is not None:  # a sampled source: each step stands for 1/p steps
            w = s.weight * scale
        if s.between_cpu is not None:
            between_sum += w * s.between_cpu
            between_n += w
        if s.samples is not None:
            samples_sum += w * s.samples
            samples_steps += w
        if s.tokens is not None:
            tokens_sum += w * s.tokens
            tokens_steps += w
        if s.skipped_updates:  # a skipped update (GradScaler): no micro-step of an accumulation
            skipped += s.skipped_updates
        elif s.optimizer_steps is not None:
            micro += s.optimizer_steps == 0
        if s.optimizer_steps is not None:
            updates = (updates or 0) + s.optimizer_steps
        if s.h2d_before_cpu is not None or s.phase_calls[H2D]:
            h2d_measured = True
        wait, traced, forward, backward, optimizer, h2d, h2d_in, exposed = step_parts(s, gpu)
        if s.comm_calls is not None:
            comm_seen = True
            comm_bytes += w * (s.comm_bytes or 0)
            comm_calls += w * s.comm_calls
            whole = s.comm_gpu if gpu else s.comm_cpu
            total_missing |= whole is None
            comm_total += w * (whole or 0.0)
            if exposed is None:
                comm_missing = True
            else:
                comm_sum += w * exposed
        optimizer_sum += w * optimizer
        h2d_sum += w * h2d
        if wait is None:
            wait_missing = True
        else:
            wait_sum += w * wait
        if traced is None:
            traced_missing = True
        else:
            traced_sum += w * traced
        if forward is None:
            forward_missing = True
        else:
            forward_sum += w * forward
        if backward is None:
            backward_missing = True
        else:
            backward_sum += w * backward
        compute = compute_time(forward, backward, optimizer)
        if compute is not None:
            compute_sum += w * compute
            if traced is not None:
                residual_sum += w * residual_time(traced, h2d_in, compute, exposed or 0.0)
        whole_step = step_time(wait, traced, h2d, h2d_in)
        if whole_step is None:
            step_missing = True
            seconds.append(traced)
        else:
            step_sum += w * whole_step
            seconds.append(whole_step)

    if scale is not None:  # weighted counts back to whole steps and bytes
        samples_steps, tokens_steps, between_n = round(samples_steps), round(tokens_steps), round(between_n)
        comm_bytes = round(comm_bytes)
    no_compute = forward_missing or backward_missing
    totals = RankTotals(
        rank=rank,
        steps=n,
        step_time=None if step_missing else step_sum,
        input_wait=None if wait_missing else wait_sum,
        traced=None if traced_missing else traced_sum,
        forward=None if forward_missing else forward_sum,
        backward=None if backward_missing else backward_sum,
        optimizer=optimizer_sum,
        h2d=h2d_sum,
        h2d_measured=h2d_measured,
        compute=None if no_compute else compute_sum,
        residual=None if no_compute or traced_missing else residual_sum,
        optimizer_updates=updates,
        micro_steps=micro,
        skipped_updates=skipped,
        samples=samples_sum if samples_steps else None,
        tokens=tokens_sum if tokens_steps else None,
        samples_steps=samples_steps,
        tokens_steps=tokens_steps,
        communication=None if comm_missing or not comm_seen else comm_sum,
        communication_total=None if total_missing or not comm_seen else comm_total,
        communication_bytes=comm_bytes if comm_seen else None,
        communication_calls=comm_calls if comm_seen else None,
        communication_measured=comm_seen,
        between_steps=between_sum if between_n else None,
        between_steps_counted=between_n,
    )
    return totals.means(), seconds


def _weight_scale(steps: Sequence[StepTiming]) -> float | None:
    """``None`` when every step counts once (an unsampled source); else the factor that scales the
    steps' ``1/p`` weights to sum to the steps read, so means divide by the step count as always."""
    if all(s.weight == 1.0 for s in steps):
        return None
    total = sum(s.weight for s in steps)
    return len(steps) / total if total > 0 else None


def _work_per_step(total: float | None, counted: float | None, steps: int) -> float | None:
    """Mean work over the steps that recorded it, when most steps did (a missing count is not zero).

    A pre-fetching loader (Accelerate's) or one step traced without a batch leaves a step without
    a count; the others still say what a step does. Fewer than half the steps counted: unknown.
    ``counted`` ``None``: every step (a counter's total).
    """
    if total is None:
        return None
    counted = steps if counted is None else counted
    if not counted or counted * 2 < steps:
        return None
    return total / counted


def component(metrics: RankMetrics, name: str) -> float | None:
    """A component's mean on one rank by summary name."""
    return getattr(metrics, name)


def share(ranks: Sequence[RankMetrics], name: str) -> float | None:
    """Median over ranks of (rank mean component / rank mean step time).

    ``None`` (unavailable) unless every rank measured both: a rule never decides on the ranks
    that happened to measure a signal while others did not.
    """
    ratios = []
    for metrics in ranks:
        value, total = component(metrics, name), metrics.step_time
        if value is None or total is None or total <= 0:
            return None
        ratios.append(value / total)
    return statistics.median(ratios) if ratios else None


def summarize(ranks: Sequence[RankMetrics], name: str) -> MetricSummary:
    """Median, worst, worst rank, skew and share of one component across ranks."""
    measured = [(component(m, name), m.rank) for m in ranks if component(m, name) is not None]
    if not measured:
        return MetricSummary(name, None, None, None, None, share(ranks, name), 0, len(ranks))
    median = statistics.median(v for v, _ in measured)
    worst, worst_rank = max(measured, key=lambda item: (item[0], -item[1]))
    skew = (worst - median) / median if median > 0 else None
    return MetricSummary(name, median, worst, worst_rank, skew, share(ranks, name), len(measured), len(ranks))


def coverage(ranks: Sequence[RankMetrics], signal: str) -> SignalCoverage:
    """How many ranks measured ``signal`` on every step."""
    return SignalCoverage(signal, sum(1 for m in ranks if component(m, signal) is not None), len(ranks))


def throughput(ranks: Sequence[RankMetrics]) -> Throughput:
    """Work per step and per second summed over ranks; ``None`` unless every rank measured it."""
    measured = sum(1 for m in ranks if m.samples_per_s is not None)

    def total(values: list[float | None]) -> float | None:
        return None if not values or any(v is None for v in values) else sum(values)  # type: ignore[arg-type]

    samples = total([m.samples_per_step for m in ranks])
    samples_rate = total([m.samples_per_s for m in ranks])
    tokens = total([m.tokens_per_step for m in ranks])
    tokens_rate = total([m.tokens_per_s for m in ranks])
    return Throughput(
        samples_per_step=samples,
        samples_per_s=samples_rate,
        time_per_sample_s=1.0 / samples_rate if samples_rate else None,
        tokens_per_step=tokens,
        tokens_per_s=tokens_rate,
        time_per_token_s=1.0 / tokens_rate if tokens_rate else None,
        measured_ranks=measured,
        observed_ranks=len(ranks),
        counted_steps=sum(m.work_steps for m in ranks),
        steps=sum(m.steps for m in ranks),
    )
