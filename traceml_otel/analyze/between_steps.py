"""Loops whose fetches are not measured: judge the traced time, and report the time between steps.

A loop that takes batches from pre-loaded tensors, a generator or a streaming reader has no
DataLoader ``next()`` to time, so its input wait is unknown and the step time (input wait + traced
block) with it. The step spans' own durations are still known, and so is the time between steps
(``traceml.between_steps.cpu_duration``: the end of one step to the start of the next). So:

- compute, communication and residual are judged as shares of the **traced** time
  (:func:`traced_basis`), instead of giving up;
- the time between steps is its own finding, BETWEEN_STEPS (:func:`between_steps_rule`): its share
  of the wall time (between + traced) at or above 0.10 fires, critical at 0.20, like the input rule.
  It is not called input wait: it holds whatever the loop does between steps (building or loading
  the batch, logging, metrics);
- a compute-bound verdict needs that share under 0.10 too.

Only when the step spans' durations or the phases themselves are missing does the diagnosis stay
INCOMPLETE_DATA.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Evidence, Finding, RankMetrics
from traceml_otel.analyze.kinds import Severity, StepKind

BETWEEN_STEPS_ADVICE = (
    "Find what the loop does between the end of one step (the optimizer update) and the start of the "
    "next (the next forward): building or loading the batch (slicing, tokenising, reading a stream), "
    "logging, metrics or host syncs. Prepare batches ahead (a background thread or a DataLoader over "
    "the source with workers), log every N steps, and to measure the fetch itself wrap the iterable in "
    "traceml.wrap_dataloader_fetch(...) (any iterable or generator)."
)


def input_unmeasured(ranks: Sequence[RankMetrics]) -> bool:
    """Some rank has no input wait on every step, but every rank has its traced time."""
    return any(m.input_wait is None for m in ranks) and all(
        m.traced is not None and m.traced > 0 for m in ranks
    )


def traced_basis(ranks: Sequence[RankMetrics]) -> tuple[RankMetrics, ...]:
    """The ranks with the traced time as their step time and no input wait: the shares the rules
    compute are then shares of the traced time."""
    return tuple(replace(m, step_time=m.traced, input_wait=0.0) for m in ranks)


def between_steps_share(ranks: Sequence[RankMetrics]) -> float | None:
    """Median over ranks of between / (between + traced); ``None`` unless every rank recorded both."""
    ratios = []
    for m in ranks:
        if m.between_steps is None or m.traced is None or m.between_steps + m.traced <= 0:
            return None
        ratios.append(m.between_steps / (m.between_steps + m.traced))
    return statistics.median(ratios) if ratios else None


def between_steps_rule(ranks: Sequence[RankMetrics]) -> Finding | None:
    """BETWEEN_STEPS: the time between steps (fetches not measured) is >= 0.10 of the wall time."""
    value = between_steps_share(ranks)
    if value is None or value < t.SHARE_WARN:
        return None
    return Finding(
        kind=StepKind.BETWEEN_STEPS,
        severity=Severity.CRITICAL if value >= t.SHARE_CRITICAL else Severity.WARNING,
        score=value,
        title="Time between steps",
        why=(
            f"{value:.0%} of wall time is between steps, not measured as input wait (no DataLoader fetch "
            "was seen): usually data loading or logging."
        ),
        next=BETWEEN_STEPS_ADVICE,
        evidence=(Evidence("between_steps_share", value, "ratio"),),
    )
