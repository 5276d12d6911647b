"""Human formatting of durations, shares, sizes, labels and the sentences both the text and the
HTML report print."""

from __future__ import annotations

from collections.abc import Sequence

from traceml_otel.analyze.communication_rules import byte_size
from traceml_otel.analyze.findings import Accumulation, DriftAnalysis, RankMetrics, Throughput, WindowInfo
from traceml_otel.analyze.kinds import DriftKind
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.startup_steps import STARTUP_FACTOR
from traceml_otel.analyze.thresholds import DRIFT_CHANGE, DRIFT_MIN_STEPS
from traceml_otel.sanitize import strip_control

PHASE_LABELS = {
    "input_wait": "input wait",
    "h2d": "h2d copies",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "comm. wait",
    "residual": "residual",
    "compute": "compute",
    "traced": "traced step",
    "step_time": "step time",
}
TABLE_ROWS = (
    "input_wait", "h2d", "forward", "backward", "optimizer", "communication", "residual", "step_time",
)
"""The phase table's rows: the parts of a step, then the whole."""


def table_rows(ranks: Sequence[RankMetrics]) -> tuple[str, ...]:
    """The rows to show: communication only when some rank measured collectives."""
    if any(m.communication_measured for m in ranks):
        return TABLE_ROWS
    return tuple(name for name in TABLE_ROWS if name != "communication")


def communication_sentence(analysis: RunAnalysis) -> str:
    """What the communication row means, with the total and bytes; empty when nothing was measured."""
    ranks = [m for m in analysis.ranks if m.communication_measured]
    if not ranks:
        return ""
    middle = sorted(ranks, key=lambda m: (m.communication_total or 0.0, m.rank))[len(ranks) // 2]
    size = (
        f", {byte_size(middle.communication_bytes)} per step"
        if middle.communication_bytes is not None else ""
    )
    text = (
        f"comm. wait is the collective time the step waited for (exposed); forward, backward and optimizer "
        f"exclude it. All collective time, overlapped or not: {seconds(middle.communication_total)} per step "
        f"on rank {middle.rank}{size}"
    )
    if any(m.communication is None for m in ranks):
        text += "; the exposed part could not be measured on every rank (async collectives), so it is n/a"
    split = [m for m in ranks if m.communication_waiting is not None and m.communication_transfer is not None]
    if split:
        most = max(split, key=lambda m: (m.communication_waiting or 0.0, -m.rank))
        whom = f" (most for rank {most.waited_for[0][0]})" if most.waited_for else ""
        waiting, transfer = seconds(most.communication_waiting), seconds(most.communication_transfer)
        text += (f". Split on rank {most.rank}, the one that waited most: {waiting} waiting for later ranks "
                 f"to arrive{whom}, {transfer} transfer")
    return text


def seconds(value: float | None) -> str:
    """``850 us``, ``12.3 ms``, ``1.24 s``; ``n/a`` when missing."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.0f} us"
    if abs(value) < 1.0:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def percent(value: float | None, digits: int = 0) -> str:
    """``31%``; ``n/a`` when missing."""
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


def signed_percent(value: float | None, digits: int = 1) -> str:
    """``+6.6%`` / ``-2.9%``; ``n/a`` when missing."""
    return "n/a" if value is None else f"{value * 100:+.{digits}f}%"


def gib(value: float) -> str:
    """An axis label in GiB (``24 GiB``, ``1.5 GiB``)."""
    return "0" if value == 0 else f"{value:g} GiB"


def size(value: float | None) -> str:
    """Bytes as ``1.50 GiB`` or ``320 MiB``; ``n/a`` when missing."""
    if value is None:
        return "n/a"
    if abs(value) >= 1 << 30:
        return f"{value / (1 << 30):.2f} GiB"
    return f"{value / (1 << 20):.0f} MiB"


def kind_label(kind: str) -> str:
    """``INPUT_STRAGGLER`` -> ``INPUT STRAGGLER``."""
    return str(kind).replace("_", " ")


def drift_sentence(drift: DriftAnalysis) -> str:
    """``slowing: typical step 18.9 ms recently vs 14.9 ms early (+26.8%), from step 301``.

    The levels are medians of normal steps (spikes left out), not the table's means: said so. A
    large change that is not drift (within the bands' noise, or not held) is not called stable
    without saying why.
    """
    if drift.kind is DriftKind.NOT_ENOUGH_STEPS:
        return (f"not judged: fewer than {DRIFT_MIN_STEPS} aligned steps to compare early and recent "
                "step times")
    levels = (f"typical step {seconds(drift.recent_s)} recently vs {seconds(drift.baseline_s)} early "
              f"({signed_percent(drift.change)}; medians without spikes, not the means above)")
    if drift.kind is DriftKind.STABLE and drift.change is not None and abs(drift.change) >= DRIFT_CHANGE:
        if drift.band_buckets is not None:
            early, recent = drift.band_buckets
            return (f"no sustained drift: {levels}; from metrics it rests on time buckets ({early} early, "
                    f"{recent} recent) and the change is within their wander or not held through the "
                    "recent ones (the span reader judges each step)")
        return (f"no sustained drift: {levels}; the change is within the step-to-step noise or not held "
                "through the recent steps")
    text = f"{drift.kind.lower().replace('_', ' ')}: {levels}"
    return text + (f", from step {drift.since_step}" if drift.since_step is not None else "")


def updates_sentence(accumulation: Accumulation) -> str:
    """``40 optimizer updates; gradient accumulation: 4.0 traced steps per update (30 micro-steps)``."""
    if accumulation.optimizer_updates is None:
        return ""
    text = f"{accumulation.optimizer_updates} optimizer updates"
    if accumulation.skipped_updates:  # GradScaler found inf/NaN gradients: no accumulation
        text += (f"; {accumulation.skipped_updates} skipped update"
                 f"{'' if accumulation.skipped_updates == 1 else 's'} (GradScaler found inf/NaN gradients)")
    if accumulation.micro_steps and accumulation.steps_per_update:
        text += (
            f"; gradient accumulation: {accumulation.steps_per_update:.1f} traced steps per update "
            f"({accumulation.micro_steps} micro-steps)"
        )
    return text


def rate(value: float | None, unit: str) -> str:
    """``1,234 samples/s``, ``56.2 samples/s``; ``n/a`` when missing."""
    if value is None:
        return "n/a"
    return f"{value:,.0f} {unit}/s" if value >= 100 else f"{value:.3g} {unit}/s"


def count(value: float | None) -> str:
    """``64`` or ``63.5``; ``n/a`` when missing."""
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def throughput_sentence(throughput: Throughput) -> str:
    """``5,120 samples/s (64 samples per step; 195 us per sample)``; empty when not measured."""
    parts = []
    if throughput.samples_per_s is not None:
        parts.append(
            f"{rate(throughput.samples_per_s, 'samples')} ({count(throughput.samples_per_step)} samples per "
            f"step; {seconds(throughput.time_per_sample_s)} per sample)"
        )
        if throughput.counted_steps < throughput.steps:
            parts[-1] += (f", samples counted on {throughput.counted_steps:,} of {throughput.steps:,} steps "
                          "(the others did not carry a count)")
    if throughput.tokens_per_s is not None:
        parts.append(f"{rate(throughput.tokens_per_s, 'tokens')} ({count(throughput.tokens_per_step)} tokens "
                     "per step)")
    if not parts and throughput.observed_ranks and throughput.measured_ranks:
        return (f"samples per step recorded on {throughput.measured_ranks} of {throughput.observed_ranks} "
                "ranks only")
    return "; ".join(parts)


def throughput_gap(analysis: RunAnalysis) -> str:
    """Why the run's throughput is not known, naming the real cause."""
    work = analysis.throughput
    if work.counted_steps and work.measured_ranks < work.observed_ranks:
        unmeasured = plural(work.observed_ranks - work.measured_ranks, "rank")
        if work.counted_steps >= work.steps:  # every step counted: the rate lacks its time, not its work
            return (f"samples were counted on every step, but {unmeasured} recorded no step time to divide "
                    "them by (its input wait was not measured)")
        return (f"samples counted on {work.counted_steps:,} of {work.steps:,} steps; {unmeasured} counted "
                "them on fewer than half of its steps; pass trace_step(model, samples=N) where the loader's "
                "batch is not what the step uses")
    if any(host.has_loader for host in analysis.hosts):
        return ("the DataLoader's batches have no tensor with a batch dimension to count (the first tensor "
                "of a tuple, list or dict is read); pass trace_step(model, samples=N)")
    return "no samples per step recorded (no DataLoader was seen; pass trace_step(model, samples=N))"


def plural(number: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{number} {word}{'' if number == 1 else 's'}"


def trace_link(template: str | None, trace_id: str) -> str | None:
    """The template with the trace id filled in (``None`` without a template or an id)."""
    if not template or not trace_id:
        return None
    return template.replace("{trace_id}", trace_id)


STEP_SOURCE_TEXT = {
    "trace_step": "trace_step blocks",
    "hf_trainer": "the Hugging Face Trainer callback",
    "lightning": "the Lightning callback",
    "inferred": ("inference from the loop's own calls (no trace_step: one step per optimizer update, or per "
                 "backward without an optimizer)"),
}


def step_sources_text(sources: tuple[str, ...]) -> str:
    """How the steps were found, in words: ``inference from the loop's own calls (...)``."""
    return "; ".join(STEP_SOURCE_TEXT.get(source) or strip_control(source)[:40] for source in sources[:4])


def startup_text(window: WindowInfo) -> str:
    """``steps 0-1 took 15.8 s, each 10x or more the run's median step (a compile, first allocations):
    left out of the means and the verdict``, or empty."""
    if not window.startup_steps or window.first_step is None:
        return ""
    last = window.startup_last_step
    one = last == window.first_step
    steps = f"step {last}" if one else f"steps {window.first_step}-{last}"
    return (f"{steps} took {seconds(window.startup_s)}, {'' if one else 'each '}{STARTUP_FACTOR:g}x or more "
            "the run's median step (a compile, first allocations): left out of the means and the verdict")
