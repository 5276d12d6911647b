"""Start-up steps: the leading steps far slower than the run's typical step, left out of the verdict.

A run's first steps compile (``torch.compile``: seconds to minutes in step 0's forward), allocate and
autotune. They say nothing about the steady run, yet a whole-window mean takes them in: a 15.8 s
compile step among 383 steps of 2 ms was 96 % of a real run's step time, and the run read
COMPUTE_BOUND (the compile's forward) where its ordinary steps waited 16 % of their time for input.

The leading steps whose step time (input wait + traced, CPU clock, median over the ranks) is at least
:data:`STARTUP_FACTOR` times the window's median step are left out of the per-step means, as stalls and
captured steps are, and the report says which and how long they took. Only leading ones, at most
:data:`MAX_SHARE` of the window: a slow step later in the run is the run's own (a spike, a slow period)
and stays in. Both engines hand their per-step series to :func:`startup_steps`, so they agree.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze.findings import WindowInfo
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.window import StepWindow

STARTUP_FACTOR = 10.0
"""A leading step this many times the window's median step time, or more, is start-up (a compile, first
allocations), never the run's typical work; ordinary noise and spikes stay well under it."""
MIN_STEPS = 20
"""Windows shorter than this keep every step (too few to tell the typical step)."""
MAX_SHARE = 0.1
"""At most this share of the window's steps is start-up (the warm-up drift skips is as long)."""


def startup_steps(series: Sequence[float | None]) -> int:
    """How many leading steps of ``series`` (each aligned step's time, in step order; ``None`` where
    unknown) are start-up: each at least :data:`STARTUP_FACTOR` x the median of the known times."""
    known = [value for value in series if value is not None and value > 0]
    if len(series) < MIN_STEPS or len(known) < MIN_STEPS:
        return 0
    return leading_slow(series, int(len(series) * MAX_SHARE))


def leading_slow(series: Sequence[float | None], limit: int) -> int:
    """How many of the first ``limit`` steps of ``series`` are each at least :data:`STARTUP_FACTOR` x
    the median of its known times, in a row from the first (:func:`startup_steps` without its minimum
    length: the live time counters decide on slow steps before 20 of them, ``emit/time_metrics.py``)."""
    known = [value for value in series if value is not None and value > 0]
    if not known:
        return 0
    typical = statistics.median(known)
    count = 0
    for value in series[:limit]:
        if value is None or value < STARTUP_FACTOR * typical:
            break
        count += 1
    return count


def with_startup(info: WindowInfo, numbers: Sequence[int], series: Sequence[float | None]) -> WindowInfo:
    """``info`` with the start-up steps of a window that begins at the run's first step: ``numbers``
    its step numbers, ``series`` their times (both engines; ``info.startup_steps`` says how many)."""
    count = startup_steps(series)
    if not count:
        return info
    return replace(info, startup_steps=count, startup_last_step=numbers[count - 1],
                   startup_s=sum(t for t in series[:count] if t is not None))


def step_time(step: StepTiming) -> float | None:
    """One rank's step time as start-up is judged on: input wait + traced, CPU clock (``None``: untimed)."""
    return None if step.traced_cpu is None else (step.input_wait_cpu or 0.0) + step.traced_cpu


def step_times(window: StepWindow) -> list[float | None]:
    """Each aligned step's :func:`step_time` in ``window``, the median over ranks; ``None`` where no rank
    timed it (the series :func:`startup_steps` reads, from records)."""
    out: list[float | None] = []
    for column in zip(*window.per_rank, strict=True):
        times = [t for s in column if (t := step_time(s)) is not None]
        out.append(statistics.median(times) if times else None)
    return out
