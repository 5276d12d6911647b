"""The analysis output records: findings, per-rank metrics, memory and drift (the whole run's record,
which holds them and every other analysis, is :class:`~traceml_otel.analyze.run_analysis.RunAnalysis`).

Reporters read only these. Times are seconds, memory bytes, shares and scores ratios in [0, 1+].
"""

from __future__ import annotations

from dataclasses import dataclass

from traceml_otel.analyze.kinds import DriftKind, MemoryKind, Severity


@dataclass(frozen=True, slots=True)
class Evidence:
    """One number behind a finding (``unit``: ``s``, ``ratio``, ``rank``, ``By`` or empty)."""

    name: str
    value: float | int | str | None
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    """A diagnosis: its stable kind, how bad it is, and the Why / Next wording."""

    kind: str
    severity: Severity
    score: float | None
    title: str
    why: str
    next: str
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True, slots=True)
class SignalCoverage:
    """How many of the observed ranks measured one signal on every step of the window."""

    signal: str
    measured_ranks: int
    observed_ranks: int


@dataclass(frozen=True, slots=True)
class Abstention:
    """A rule that could not decide because signals it needs were not measured."""

    rule: str
    missing: tuple[SignalCoverage, ...]


@dataclass(frozen=True, slots=True)
class StepDiagnosis:
    """Step-time findings sorted by severity then score; ``primary`` is the first (or a fallback)."""

    primary: Finding
    issues: tuple[Finding, ...]
    abstentions: tuple[Abstention, ...] = ()
    caps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RankMetrics:
    """Means over one rank's steps in the window, on the window's clock; ``None`` = unavailable."""

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
    optimizer_updates: int | None
    micro_steps: int
    samples_per_step: float | None = None
    """Mean samples over the steps that recorded a count; ``None`` unless at least half of them did."""
    tokens_per_step: float | None = None
    communication: float | None = None
    """Exposed collective time per step (the part the step waited for); ``None`` when not measured.
    Forward, backward and optimizer above exclude the part of it that lay inside them."""
    communication_total: float | None = None
    """All collective time per step, overlapping compute or not."""
    communication_bytes: float | None = None
    communication_measured: bool = False
    """Collective timing saw at least one collective on this rank."""
    work_steps: int = 0
    """Steps that recorded a sample count (``samples_per_step`` is their mean)."""
    communication_calls: float | None = None
    """Collective calls per step (mean), when collectives were timed."""
    communication_waiting: float | None = None
    """Of ``communication``: waiting for a later rank to arrive (``communication_split.py``); ``None``
    unless two or more ranks measured exposed time on every step."""
    communication_transfer: float | None = None
    """Of ``communication``: the rest, the collectives themselves once every rank had arrived."""
    waited_for: tuple[tuple[int, float], ...] = ()
    """(rank, mean waiting per step for it), largest first, at most three."""
    split_basis: str = ""
    """How the split was made: ``entry times`` (every step), else ``least-waiting rank`` on some steps."""
    between_steps: float | None = None
    """Mean time between the end of one step and the start of the next (input wait included, less
    ``outside_step`` blocks), over the steps that recorded it; ``None`` when none did."""
    skipped_updates: int = 0
    """Updates a ``GradScaler.step`` skipped (inf/NaN gradients): steps without an update that are no
    accumulation micro-steps."""

    @property
    def samples_per_s(self) -> float | None:
        """This rank's throughput: mean samples per step over mean step time."""
        return _rate(self.samples_per_step, self.step_time)

    @property
    def tokens_per_s(self) -> float | None:
        return _rate(self.tokens_per_step, self.step_time)


def _rate(work: float | None, seconds: float | None) -> float | None:
    return None if work is None or seconds is None or seconds <= 0 else work / seconds


@dataclass(frozen=True, slots=True)
class Throughput:
    """Work per step and per second over all ranks (data parallel: the ranks' work adds up).

    ``samples_per_step`` is the sum over ranks of each rank's mean; ``samples_per_s`` the sum of the
    ranks' rates; ``time_per_sample_s`` its inverse. ``None`` unless every rank recorded the work.
    """

    samples_per_step: float | None = None
    samples_per_s: float | None = None
    time_per_sample_s: float | None = None
    tokens_per_step: float | None = None
    tokens_per_s: float | None = None
    time_per_token_s: float | None = None
    measured_ranks: int = 0
    observed_ranks: int = 0
    counted_steps: int = 0
    """Steps, over all ranks, that recorded a sample count."""
    steps: int = 0
    """Steps over all ranks: more than ``counted_steps`` when some carried no count."""


NO_THROUGHPUT = Throughput()
"""A run without samples or tokens recorded."""


@dataclass(frozen=True, slots=True)
class MetricSummary:
    """One component across ranks: the median of rank means, the worst rank, skew and share."""

    name: str
    median: float | None
    worst: float | None
    worst_rank: int | None
    skew: float | None
    share: float | None
    measured_ranks: int
    observed_ranks: int


@dataclass(frozen=True, slots=True)
class RankMemory:
    """A rank's highest per-step memory peaks over the window (bytes)."""

    rank: int
    peak_allocated: int | None
    peak_reserved: int | None
    total: int | None


@dataclass(frozen=True, slots=True)
class MemoryAnalysis:
    """The step-memory section: its status kind, findings and per-rank peaks."""

    status: MemoryKind
    findings: tuple[Finding, ...]
    ranks: tuple[RankMemory, ...]
    pressure: float | None = None
    imbalance: float | None = None
    growth_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DriftAnalysis:
    """Typical step time early in the run against the recent steps, and where the change began."""

    kind: DriftKind
    baseline_s: float | None = None
    recent_s: float | None = None
    change: float | None = None
    since_step: int | None = None
    baseline_steps: tuple[int, int] | None = None
    recent_steps: tuple[int, int] | None = None
    segment_steps: tuple[int, int] | None = None
    """Which segment changed: the last segment whose level differs from the reference's (step range)."""
    segment_start_unix: float | None = None
    """When that segment began (Unix seconds)."""
    segment_change: float | None = None
    """By how much: its typical step time against the reference segment's."""
    segment_typical_s: float | None = None
    """Its typical step time (seconds): against ``baseline_s``, its change against the early steps."""
    reference_steps: tuple[int, int] | None = None
    """The reference (steady) segment's step range."""
    from_segment: bool = False
    """The kind comes from a slow or fast period that ends the run, not from the bands' test."""
    band_buckets: tuple[int, int] | None = None
    """From metrics: the time buckets the baseline and recent bands rest on (their independent
    values); None when judged on steps."""


@dataclass(frozen=True, slots=True)
class WorstStep:
    """One of the slowest steps: which rank, how long, what dominated, and its trace id."""

    step: int
    rank: int
    step_time: float
    trace_id: str
    dominant: str
    dominant_s: float | None


@dataclass(frozen=True, slots=True)
class RankSeries:
    """A rank's step time (and reserved-memory peak) over the window, thinned for charts."""

    rank: int
    steps: tuple[int, ...]
    step_time: tuple[float, ...]
    peak_reserved: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class Accumulation:
    """Optimizer updates against ``trace_step`` blocks (gradient accumulation)."""

    optimizer_updates: int | None
    micro_steps: int
    steps_per_update: float | None
    skipped_updates: int = 0
    """Updates a ``GradScaler.step`` skipped (counted apart from accumulation)."""


@dataclass(frozen=True, slots=True)
class RankCount:
    """How many steps one rank recorded, and the first and last step numbers."""

    rank: int
    steps: int
    first_step: int
    last_step: int


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A traced step that raised."""

    rank: int
    step: int
    exception_type: str


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Where the data came from and what the run was."""

    run_id: str
    source: str
    service: str = ""
    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    parallelism: str = "none"
    command: str = ""
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    spans_read: int = 0
    steps_read: int = 0
    failed_steps: int = 0
    other_run_ids: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    warnings_total: int = 0
    missing_ranks: tuple[int, ...] = ()
    rank_steps: tuple[RankCount, ...] = ()
    failures: tuple[StepFailure, ...] = ()
    step_sources: tuple[str, ...] = ()
    """How the steps were found (``traceml.step.source`` values seen, most steps first)."""


@dataclass(frozen=True, slots=True)
class WindowInfo:
    """The aligned steps analysed: how chosen, first and last step numbers and how many."""

    mode: str
    first_step: int | None
    last_step: int | None
    steps: int
    requested: str = ""
    left_out_steps: int = 0
    """Aligned steps left out of the per-step means: those a stall interrupted, those a deep capture
    slowed and the start-up steps (the ranks' step counts are of the steps kept)."""
    startup_steps: int = 0
    """Leading steps left out as start-up (a compile, first allocations:
    :mod:`~traceml_otel.analyze.startup_steps`); counted in ``left_out_steps`` too."""
    startup_last_step: int | None = None
    startup_s: float = 0.0
    """Their step time (median over ranks, summed), seconds."""
