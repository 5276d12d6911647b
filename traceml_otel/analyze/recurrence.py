"""Stragglers with recurrence: which rank held the others back in each window of the run.

The analysed window (stalled steps left out) is cut into fixed windows of :data:`WINDOW_STEPS` aligned
steps (100; a shorter run into :data:`MIN_WINDOWS` equal windows of at least :data:`MIN_WINDOW_STEPS`
steps, a longer one into at most :data:`MAX_WINDOWS`). In each window the spike steps are left out (a
step whose slowest rank took more than the window's median by :data:`SPIKE_MADS` scaled MADs: one
rank's hiccup is not a slow window), then the rank-straggler rule (measured waits or backward times,
the same rule and thresholds as the whole run) names its culprit, or none. Then, over the W windows:

- **chronic**: one rank is the culprit in at least :data:`CHRONIC_SHARE` (two thirds) of the windows;
- **transient**: culprits in at most :data:`TRANSIENT_SHARE` (a third) of the windows, or a single rank
  in a minority of them;
- **rotating**: culprits in more windows than that, shared among two or more ranks, none of them chronic.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from traceml_otel.analyze.findings import Finding, RankMetrics
from traceml_otel.analyze.window import StepWindow

WINDOW_STEPS = 100
MIN_WINDOWS = 10
MIN_WINDOW_STEPS = 10
MAX_WINDOWS = 200
SPIKE_MADS = 3.0
CHRONIC_SHARE = 2 / 3
TRANSIENT_SHARE = 1 / 3

CHRONIC, ROTATING, TRANSIENT, NONE = "chronic", "rotating", "transient", "none"

ADVICE = {
    CHRONIC: ("Rank {r} is slow in most windows: the cause stays with it (its host, device, data shard or "
              "placement). Check that node and its input; replace or drain it if it stays slow."),
    ROTATING: ("The slow rank changes from window to window: look at what they share (the network, "
               "storage, a noisy neighbour on the hosts, uneven batches) rather than at one node."),
    TRANSIENT: ("A rank was slow in only a few windows (steps {where}): likely a passing event (a job beside "
                "it, a slow read, a checkpoint); watch for it again before acting."),
    NONE: "",
}


@dataclass(frozen=True, slots=True)
class StragglerRecurrence:
    """Each window's culprit rank and the pattern they make."""

    pattern: str
    """``chronic``, ``rotating``, ``transient`` or ``none``."""
    window_steps: int
    windows: int
    culprits: tuple[int | None, ...]
    """Per window, the culprit rank (``None``: no straggler in it)."""
    window_starts: tuple[int, ...]
    """First step number of each window."""
    counts: tuple[tuple[int, int], ...]
    """(rank, windows it was the culprit in), most first."""
    text: str
    advice: str


def kept_indices(slowest: Sequence[float]) -> list[int] | None:
    """Indices of a window's steps that are not spikes, from each step's slowest rank's fetch + block;
    ``None`` when every step stays (no spike, fewer than 4 steps, or spikes in half or more of them)."""
    if len(slowest) < 4:
        return None
    middle = statistics.median(slowest)
    limit = middle + SPIKE_MADS * 1.4826 * statistics.median(abs(v - middle) for v in slowest)
    keep = [i for i, v in enumerate(slowest) if v <= limit]
    return None if len(keep) == len(slowest) or len(keep) < len(slowest) // 2 else keep


def _without_spikes(window: StepWindow) -> StepWindow:
    """``window`` less its spike steps (see the module docstring); at least half its steps stay."""
    slowest = [max((s.input_wait_cpu or 0.0) + (s.traced_cpu or 0.0) for s in column)
               for column in zip(*window.per_rank, strict=True)]
    keep = kept_indices(slowest)
    if keep is None:
        return window
    return StepWindow(window.ranks, tuple(window.step_numbers[i] for i in keep),
                      tuple(tuple(steps[i] for i in keep) for steps in window.per_rank))


def window_size(steps: int) -> int:
    """Steps per window for a run of ``steps`` aligned steps."""
    if steps >= WINDOW_STEPS * MIN_WINDOWS:
        return max(WINDOW_STEPS, -(-steps // MAX_WINDOWS))
    return max(MIN_WINDOW_STEPS, steps // MIN_WINDOWS)


def classify(culprits: Sequence[int | None]) -> str:
    """The pattern of per-window culprits (see the module docstring)."""
    windows = len(culprits)
    named = [c for c in culprits if c is not None]
    if not windows or not named:
        return NONE
    counts = Counter(named)
    top = counts.most_common(1)[0][1]
    if top >= CHRONIC_SHARE * windows:
        return CHRONIC
    if len(named) <= TRANSIENT_SHARE * windows or len(counts) == 1:
        return TRANSIENT
    return ROTATING


def recurrence(
    window: StepWindow, metrics: Callable[[StepWindow], Sequence[RankMetrics]],
    rule: Callable[[Sequence[RankMetrics]], Finding | object | None],
) -> StragglerRecurrence | None:
    """Per-window culprits of ``window``; ``None`` for one rank or too few steps for two windows.

    ``metrics`` gives a sub-window's rank metrics; ``rule`` its straggler finding (or not).
    """
    n = window.steps
    if len(window.ranks) < 2 or n < 2 * MIN_WINDOW_STEPS:
        return None
    size = window_size(n)
    culprits: list[int | None] = []
    starts: list[int] = []
    for a, b in window_bounds(n):
        sub = _without_spikes(StepWindow(window.ranks, window.step_numbers[a:b],
                                         tuple(s[a:b] for s in window.per_rank)))
        culprits.append(culprit_of(rule(metrics(sub))))
        starts.append(window.step_numbers[a])
    return recurrence_of(culprits, starts, size)


def window_bounds(steps: int) -> list[tuple[int, int]]:
    """The windows of a run of ``steps`` aligned steps, as index ranges; a short tail (under half a
    window) is left out."""
    size = window_size(steps)
    out: list[tuple[int, int]] = []
    for a in range(0, steps, size):
        b = min(steps, a + size)
        if b - a < size // 2 and out:
            break
        out.append((a, b))
    return out


def culprit_of(found: Finding | object | None) -> int | None:
    """The culprit rank a straggler finding names (``None``: no straggler)."""
    if isinstance(found, Finding) and str(found.kind).endswith("STRAGGLER"):
        named = (e.value for e in found.evidence if e.name == "culprit_rank" and e.value is not None)
        return next((int(v) for v in named), None)
    return None


def recurrence_of(culprits: Sequence[int | None], starts: Sequence[int], size: int) -> StragglerRecurrence:
    """The pattern of the windows' ``culprits`` (windows of ``size`` steps starting at ``starts``)."""
    pattern = classify(culprits)
    counts = tuple(Counter(c for c in culprits if c is not None).most_common())
    windows = len(culprits)
    slow = ", ".join(f"rank {r} in {k}" for r, k in counts[:4]) + (" ..." if len(counts) > 4 else "")
    text = (f"{pattern}: " + (f"{slow} of {windows} windows of {size} steps" if counts
                              else f"no straggler in {windows} windows of {size} steps"))
    where = ", ".join(f"{s}-{s + size - 1}" for s, c in zip(starts, culprits, strict=True) if c is not None)
    advice = ADVICE[pattern].format(r=counts[0][0] if counts else "", where=where[:120])
    return StragglerRecurrence(pattern, size, windows, tuple(culprits), tuple(starts), counts, text, advice)
