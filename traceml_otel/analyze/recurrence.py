"""Stragglers with recurrence: which rank held the others back in each window of the run.

The analysed window (stalled steps left out) is cut into fixed windows of :data:`WINDOW_STEPS` aligned
steps (100; a shorter run into :data:`MIN_WINDOWS` equal windows of at least :data:`MIN_WINDOW_STEPS`
steps, a longer one into at most :data:`MAX_WINDOWS`). In each window the spike steps are left out (a
step whose slowest rank took more than the window's median by :data:`SPIKE_MADS` scaled MADs: one
rank's hiccup is not a slow window), then the rank-straggler rule (measured waits or backward times,
the same rule and thresholds as the whole run) names its culprit, or none. Then, over the W windows:

- **chronic**: one rank is the culprit in at least :data:`CHRONIC_SHARE` (two thirds) of the windows;
  or, from some window on, in two thirds of the windows to the last one and in the last one itself, at
  least :data:`ONSET_MIN_WINDOWS` of them (a rank that became slow mid-run and still was at the end:
  chronic since that window's first step, ``since_step``, not a passing event);
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
ONSET_MIN_WINDOWS = 3
"""A run of windows to the end at least this long makes a rank chronic from its first window on."""

CHRONIC, ROTATING, TRANSIENT, NONE = "chronic", "rotating", "transient", "none"
ONSET, TRANSIENT_AT_END = "onset", "transient at the end"
"""Not patterns: the advice keys of a chronic straggler that began mid-run (``since_step``) and of a
transient one whose windows reach the run's end."""

ADVICE = {
    CHRONIC: ("Rank {r} is slow in most windows: the cause stays with it (its host, device, data shard or "
              "placement). Check that node and its input; replace or drain it if it stays slow."),
    ONSET: ("Rank {r} became slow at step {since} and still was at the end: something changed then on it "
            "(its host, device, data shard, a job started beside it). Check that node from that time on; "
            "replace or drain it if it stays slow."),
    ROTATING: ("The slow rank changes from window to window: look at what they share (the network, "
               "storage, a noisy neighbour on the hosts, uneven batches) rather than at one node."),
    TRANSIENT: ("A rank was slow in only a few windows (steps {where}): likely a passing event (a job beside "
                "it, a slow read, a checkpoint); watch for it again before acting."),
    TRANSIENT_AT_END: ("A rank was slow in only a few windows (steps {where}), the last of them at the run's "
                       "end: it may not have passed; watch the next run for it before acting."),
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
    since_step: int | None = None
    """For a rank chronic from a window on (not from the start): that window's first step."""


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


def onset_window(culprits: Sequence[int | None]) -> int | None:
    """The first window from which the last window's culprit is the culprit in at least
    :data:`CHRONIC_SHARE` of the windows to the end, at least :data:`ONSET_MIN_WINDOWS` of them: a rank
    that became a straggler then and still was one at the end (``None``: none such, or another rank was
    the culprit in more than :data:`TRANSIENT_SHARE` of the windows before: the slow rank changed, a
    rotating pattern)."""
    if not culprits or culprits[-1] is None:
        return None
    rank = culprits[-1]
    found = None
    mine = 0
    for index in range(len(culprits) - 1, -1, -1):  # from the end back: the earliest start that holds
        mine += culprits[index] == rank
        if culprits[index] == rank and mine >= ONSET_MIN_WINDOWS and mine >= CHRONIC_SHARE * (
                len(culprits) - index):
            found = index
    if found is None:
        return None
    others = Counter(c for c in culprits[:found] if c is not None and c != rank)
    return None if others and max(others.values()) > TRANSIENT_SHARE * found else found


def _chronic_by_share(culprits: Sequence[int | None]) -> bool:
    """One rank is the culprit in at least :data:`CHRONIC_SHARE` of all the windows."""
    counts = Counter(c for c in culprits if c is not None)
    return bool(counts) and counts.most_common(1)[0][1] >= CHRONIC_SHARE * len(culprits)


def classify(culprits: Sequence[int | None]) -> str:
    """The pattern of per-window culprits (see the module docstring)."""
    windows = len(culprits)
    named = [c for c in culprits if c is not None]
    if not windows or not named:
        return NONE
    counts = Counter(named)
    if _chronic_by_share(culprits) or onset_window(culprits) is not None:
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
    onset = onset_window(culprits) if pattern == CHRONIC and not _chronic_by_share(culprits) else None
    since = starts[onset] if onset else None  # chronic over the run's windows: all along
    slow = ", ".join(f"rank {r} in {k}" for r, k in counts[:4]) + (" ..." if len(counts) > 4 else "")
    text = (f"{pattern}: " + (f"{slow} of {windows} windows of {size} steps" if counts
                              else f"no straggler in {windows} windows of {size} steps"))
    if since is not None and onset is not None:
        late = culprits[onset:].count(culprits[-1])
        text = (f"{pattern} since step {since}: rank {culprits[-1]} in {late} of the {windows - onset} "
                f"windows from there to the end ({slow} of {windows} windows of {size} steps)")
    where = ", ".join(f"{s}-{s + size - 1}" for s, c in zip(starts, culprits, strict=True) if c is not None)
    lead = culprits[-1] if since is not None else (counts[0][0] if counts else "")
    key = ONSET if since is not None else (
        TRANSIENT_AT_END if pattern == TRANSIENT and culprits and culprits[-1] is not None else pattern)
    advice = ADVICE[key].format(r=lead, where=where[:120], since=since)
    return StragglerRecurrence(pattern, size, windows, tuple(culprits), tuple(starts), counts, text, advice,
                               since)
