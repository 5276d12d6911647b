"""One side of ``traceml compare``: what it needs from a run's analysis or a stored ``report.json``
(:class:`RunSummary`), read the same way from both so a fresh run compares with last week's report."""

from __future__ import annotations

from dataclasses import dataclass, replace

from traceml_otel.analyze.compare_noise import RunNoise
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.run_analysis import RunAnalysis

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "communication", "residual")


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What ``compare`` needs from one report."""

    label: str
    run_id: str
    kind: str
    severity: str
    clock: str
    steps: int
    step_time: float | None
    phases: tuple[tuple[str, float | None], ...]
    peak_memory: int | None
    samples_per_step: float | None = None
    time_per_sample: float | None = None
    tokens_per_step: float | None = None
    time_per_token: float | None = None
    problem: str = ""
    """Why this side has no usable data (unreadable or not a report); empty when it has."""
    goodput: float | None = None
    """Share of wall time inside step blocks (``time_accounting.goodput``; shown, never a verdict)."""
    mfu: float | None = None
    noise: RunNoise | None = None
    """The run's block means and CPU wait (``None``: no estimate of its own noise)."""
    members: tuple[RunSummary, ...] = ()
    """The runs pooled into this side (empty: a single run)."""

    def phase(self, name: str) -> float | None:
        return dict(self.phases).get(name)

    @property
    def usable(self) -> bool:
        """False when the side has no step time to compare (no data, unreadable, warm-up only)."""
        return not self.problem and self.step_time is not None and self.kind not in (
            StepKind.NO_DATA, StepKind.WARMUP)


def summary_of(analysis: RunAnalysis, label: str) -> RunSummary:
    """What ``compare`` needs from one run's analysis (the fields ``report.json`` carries, read directly)."""
    primary = analysis.step.primary
    throughput = analysis.throughput
    account = analysis.time_account
    return filled(RunSummary(
        label=label,
        run_id=analysis.run.run_id,
        kind=str(primary.kind),
        severity=str(primary.severity),
        clock=str(analysis.clock),
        steps=analysis.window.steps,
        step_time=_median(analysis, "step_time") or _median(analysis, "traced"),
        phases=tuple((name, _median(analysis, name)) for name in PHASES),
        peak_memory=peak_memory([(m.peak_reserved, m.peak_allocated) for m in analysis.memory.ranks]),
        samples_per_step=throughput.samples_per_step,
        time_per_sample=throughput.time_per_sample_s,
        tokens_per_step=throughput.tokens_per_step,
        time_per_token=throughput.time_per_token_s,
        goodput=None if account is None else account.goodput,
        mfu=None if analysis.mfu is None else analysis.mfu.mfu,
        noise=analysis.noise,
    ))


def filled(summary: RunSummary) -> RunSummary:
    """Time per sample (token) from step time and work per step when the analysis gave none (a run
    without a DataLoader has no input wait: its step time is its traced time, as its noise series)."""
    if summary.step_time is None:
        return summary
    per_sample, per_token = summary.time_per_sample, summary.time_per_token
    if per_sample is None and summary.samples_per_step:
        per_sample = summary.step_time / summary.samples_per_step
    if per_token is None and summary.tokens_per_step:
        per_token = summary.step_time / summary.tokens_per_step
    if (per_sample, per_token) == (summary.time_per_sample, summary.time_per_token):
        return summary
    return replace(summary, time_per_sample=per_sample, time_per_token=per_token)


def _median(analysis: RunAnalysis, name: str) -> float | None:
    summary = analysis.summary(name)
    return None if summary is None else summary.median


def peak_memory(ranks: list[tuple[float | None, float | None]]) -> int | None:
    """The highest peak of any rank, from (reserved, allocated) pairs: reserved where a rank recorded
    it (above 0), else allocated; ``None`` without any."""
    peaks = [reserved or allocated for reserved, allocated in ranks]
    known = [peak for peak in peaks if peak is not None]
    return int(max(known)) if known else None


def unusable_summary(label: str, problem: str) -> RunSummary:
    """A side that could not be read as a run or a report: it makes the comparison INCONCLUSIVE."""
    return RunSummary(label, "", str(StepKind.NO_DATA), "info", "", 0, None, (), None, problem=problem)
