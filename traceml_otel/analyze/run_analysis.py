"""The analysis of one run: every analysis' record in one place, what the reporters show.

The base records it is made of (findings, per-rank metrics, summaries) are in
:mod:`traceml_otel.analyze.findings`; the analyses each have their own module.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceml_otel.analyze.captures import CaptureAnalysis
from traceml_otel.analyze.compare_noise import RunNoise
from traceml_otel.analyze.findings import (
    NO_THROUGHPUT,
    Accumulation,
    DriftAnalysis,
    Finding,
    MemoryAnalysis,
    MetricSummary,
    RankMetrics,
    RankSeries,
    RunInfo,
    StepDiagnosis,
    Throughput,
    WindowInfo,
    WorstStep,
)
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.mfu import MfuAnalysis
from traceml_otel.analyze.recurrence import StragglerRecurrence
from traceml_otel.analyze.run_model import RankHost
from traceml_otel.analyze.segments import SegmentAnalysis
from traceml_otel.analyze.stalls import NO_STALLS, StallAnalysis
from traceml_otel.analyze.time_accounting import TimeAccount


@dataclass(frozen=True, slots=True)
class RunAnalysis:
    """Everything the reporters show about one run."""

    run: RunInfo
    window: WindowInfo
    clock: Clock
    ranks: tuple[RankMetrics, ...]
    summaries: tuple[MetricSummary, ...]
    step: StepDiagnosis
    memory: MemoryAnalysis
    drift: DriftAnalysis
    worst_steps: tuple[WorstStep, ...]
    series: tuple[RankSeries, ...]
    accumulation: Accumulation
    run_findings: tuple[Finding, ...] = ()
    """Findings about the data itself (missing or partial ranks, a failed run), most serious first."""
    throughput: Throughput = NO_THROUGHPUT
    hosts: tuple[RankHost, ...] = ()
    """Per rank: usable CPUs and DataLoader settings, as recorded."""
    time_account: TimeAccount | None = None
    """Where the job's time went, from launch to exit (run folders with time records; see goodput.md)."""
    mfu: MfuAnalysis | None = None
    """Model FLOPs utilisation, when the program declared or measured its FLOPs."""
    noise: RunNoise | None = None
    """The run's own variability (block means of its steady steps) and CPU wait, for ``compare``."""
    segments: SegmentAnalysis | None = None
    """Where the step time or the phase mix changed, each part with its own verdict (``segments.py``)."""
    stalls: StallAnalysis = NO_STALLS
    """Stall and hang events (``stalls.py``); their steps are left out of the per-step means."""
    straggler_recurrence: StragglerRecurrence | None = None
    """Each window's straggler and the pattern they make (``recurrence.py``)."""
    captures: CaptureAnalysis | None = None
    """The run folder's deep captures (``captures.py``, ``docs/captures.md``); ``None``: none."""

    def summary(self, name: str) -> MetricSummary | None:
        """The cross-rank summary of one component (``step_time``, ``forward``, ...)."""
        return next((s for s in self.summaries if s.name == name), None)
