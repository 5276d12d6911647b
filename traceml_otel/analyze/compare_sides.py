"""A side of ``traceml compare`` made of one or several runs, and the intervals between two sides.

Several runs of one side are pooled into one :class:`RunSummary` for the table (means of the runs'
step times, time per unit of work and phases; the diagnosis of the run whose time per unit of work is
the median), and kept as ``members`` for the interval (:mod:`traceml_otel.analyze.compare_interval`).
Each run's mean and error come from its ``noise`` (block means, :mod:`traceml_otel.analyze.compare_noise`),
scaled from step time to the unit of work by the run's own ratio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from statistics import fmean
from typing import TYPE_CHECKING

from traceml_otel.analyze.compare_interval import Interval, RunMean, change_interval

if TYPE_CHECKING:
    from traceml_otel.analyze.compare_noise import RunNoise
    from traceml_otel.analyze.compare_summary import RunSummary


def pool_side(runs: Sequence[RunSummary], label: str) -> RunSummary:
    """One summary for several runs of a side (a single run is returned as it is).

    A side with an unusable run is unusable: its problem names the run."""
    if len(runs) == 1:
        return runs[0]
    broken = [r for r in runs if not r.usable]
    if broken:
        first = broken[0]
        why = first.problem or f"no usable step data ({first.kind})"
        return replace(first, label=label, problem=f"{first.label}: {why}", members=tuple(runs))
    ordered = sorted(runs, key=lambda r: _work_time(r) or 0.0)
    middle = ordered[(len(ordered) - 1) // 2]
    names = [name for name, _ in middle.phases]
    return replace(
        middle, label=label, run_id=", ".join(r.run_id or "?" for r in runs)[:200],
        steps=sum(r.steps for r in runs), step_time=_mean([r.step_time for r in runs]),
        phases=tuple((name, _mean([r.phase(name) for r in runs])) for name in names),
        peak_memory=max((r.peak_memory for r in runs if r.peak_memory is not None), default=None),
        time_per_sample=_mean([r.time_per_sample for r in runs]),
        time_per_token=_mean([r.time_per_token for r in runs]),
        goodput=_mean([r.goodput for r in runs]), mfu=_mean([r.mfu for r in runs]),
        noise=None, members=tuple(runs),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return fmean(known) if len(known) == len(values) and known else None


def _work_time(run: RunSummary) -> float | None:
    return run.time_per_token or run.time_per_sample or run.step_time


def _scale(run: RunSummary, basis: str) -> float | None:
    """Seconds per unit of work per second of step time, for this run."""
    if basis == "step":
        return 1.0
    per = run.time_per_token if basis == "token" else run.time_per_sample
    if per is None or not run.step_time or run.step_time <= 0:
        return None
    return per / run.step_time


def run_means(runs: Sequence[RunSummary], basis: str, cpu: bool = False,
              fast: bool = False) -> list[RunMean] | None:
    """Each run's mean time per unit of work with its error; ``cpu``: its on-CPU time instead; ``fast``:
    its fast-step time (``RunNoise.block_fast``). ``None`` when a run has no noise estimate (or, for
    ``cpu`` and ``fast``, not that record)."""
    import numpy as np

    out = []
    for run in runs:
        noise, scale = run.noise, _scale(run, basis)
        if noise is None or scale is None:
            return None
        means = noise.cpu_means if cpu else noise.block_fast if fast else noise.block_means
        if not means or len(means) < 2:
            return None
        values = np.asarray(means) * scale
        k = len(values)
        sd = float(np.std(values, ddof=1))
        mean = float(values.mean())
        out.append(RunMean(mean, sd / math.sqrt(k), float(k - 1), noise.wait_share,
                           sd / mean if mean > 0 else 0.0, machine_share(noise)))
    return out


def machine_share(noise: RunNoise) -> float | None:
    """The share of the machine's CPUs other work kept busy beside the run (``None``: not recorded)."""
    if not noise.cpu_block_load or noise.machine_cpus <= 0:
        return None
    return min(1.0, sum(noise.cpu_block_load) / len(noise.cpu_block_load) / noise.machine_cpus)


def other_work_share(side: RunSummary) -> float | None:
    """The side's mean share of the machine's CPUs that work outside its training processes kept busy
    (``None``: not recorded on every run)."""
    shares = []
    for run in side_runs(side):
        noise = run.noise
        if noise is None or not noise.cpu_block_others or noise.machine_cpus <= 0:
            return None
        busy = sum(noise.cpu_block_others) / len(noise.cpu_block_others)
        shares.append(min(1.0, busy / noise.machine_cpus))
    return _mean(shares)


def side_runs(side: RunSummary) -> tuple[RunSummary, ...]:
    return side.members or (side,)


def fast_interval(a: RunSummary, b: RunSummary, basis: str) -> Interval | None:
    """The change in fast-step time per unit of work, with several runs on a side (``None`` otherwise, or
    where a run did not record it): the spread between runs is measured, as for the mean."""
    runs_a, runs_b = side_runs(a), side_runs(b)
    if len(runs_a) + len(runs_b) < 3:
        return None
    name = {"token": "fast_time_per_token", "sample": "fast_time_per_sample"}.get(basis, "fast_step_time")
    fast_a, fast_b = run_means(runs_a, basis, fast=True), run_means(runs_b, basis, fast=True)
    return change_interval(name, fast_a, fast_b) if fast_a and fast_b else None


def intervals(a: RunSummary, b: RunSummary, basis: str) -> tuple[Interval | None, Interval | None]:
    """(wall interval, on-CPU interval) of the time per unit of work; ``None`` where not estimable."""
    name = {"token": "time_per_token", "sample": "time_per_sample"}.get(basis, "step_time")
    runs_a, runs_b = side_runs(a), side_runs(b)
    wall_a, wall_b = run_means(runs_a, basis), run_means(runs_b, basis)
    wall = change_interval(name, wall_a, wall_b) if wall_a and wall_b else None
    adjusted = load_adjusted(runs_a, runs_b, basis)
    if adjusted is not None:
        cpu_a, cpu_b = adjusted
    else:
        cpu_a, cpu_b = run_means(runs_a, basis, cpu=True), run_means(runs_b, basis, cpu=True)
    cpu = change_interval(f"on_cpu_{name}", cpu_a, cpu_b) if cpu_a and cpu_b else None
    if cpu is not None and adjusted is not None:
        cpu = replace(cpu, method=cpu.method + "; on-CPU time adjusted to the same machine load")
    return wall, cpu


MIN_LOAD_SPREAD = 0.05
"""Within-run spread (CPUs, summed squares over blocks) of the machine's load below which its effect on
on-CPU time is not estimated."""


def load_adjusted(runs_a: Sequence[RunSummary], runs_b: Sequence[RunSummary],
                  basis: str) -> tuple[list[RunMean], list[RunMean]] | None:
    """Each run's on-CPU time per unit of work at the same machine load (analysis of covariance).

    What else runs on the machine slows the training thread even while it holds a CPU (shared caches,
    a hyper-thread sibling, memory bandwidth). Over all runs' blocks, ``log(on-CPU per step)`` is
    regressed on the rest of the machine's busy CPUs with one slope and an intercept per run; each run's
    mean is then moved along the slope to the runs' common mean load, and its error includes the
    slope's. ``None`` when a run lacks the load or the load hardly varied within the runs."""
    import numpy as np

    runs = [*runs_a, *runs_b]
    data = []
    for run in runs:
        noise, scale = run.noise, _scale(run, basis)
        if noise is None or scale is None or noise.cpu_means is None or len(noise.cpu_block_load) != len(
                noise.cpu_block_means) or min(noise.cpu_block_means) <= 0:
            return None
        data.append((np.log(np.asarray(noise.cpu_block_means) * scale), np.asarray(noise.cpu_block_load)))
    xc = [x - x.mean() for _, x in data]
    yc = [y - y.mean() for y, _ in data]
    sxx = float(sum((x * x).sum() for x in xc))
    if sxx < MIN_LOAD_SPREAD:
        return None
    slope = float(sum((x * y).sum() for x, y in zip(xc, yc, strict=True))) / sxx
    blocks = sum(len(y) for y, _ in data)
    dof = blocks - len(data) - 1
    if dof < 2:
        return None
    residual = float(sum(((y - slope * x) ** 2).sum() for x, y in zip(xc, yc, strict=True))) / dof
    center = float(np.mean([x.mean() for _, x in data]))
    means = []
    for run, (y, x) in zip(runs, data, strict=True):
        assert run.noise is not None  # checked above
        log_mean = float(y.mean()) - slope * (float(x.mean()) - center)
        var = residual / len(y) + (float(x.mean()) - center) ** 2 * residual / sxx
        mean = math.exp(log_mean)
        spread = math.sqrt(float(((y - float(y.mean()) - slope * (x - float(x.mean()))) ** 2).sum())
                           / max(1, len(y) - 1))
        means.append(RunMean(mean, mean * math.sqrt(var), float(len(y) - 1), run.noise.wait_share, spread,
                             machine_share(run.noise)))
    return means[: len(runs_a)], means[len(runs_a):]


def wait_share(side: RunSummary) -> float | None:
    """The side's mean share of wall time its training thread waited for a CPU (``None``: not recorded)."""
    shares = [r.noise.wait_share if r.noise is not None else None for r in side_runs(side)]
    return _mean(shares)


def cpu_change(a: RunSummary, b: RunSummary, basis: str) -> float | None:
    """Relative change of on-CPU time per unit of work, for the text."""
    import numpy as np

    def per_step(side: RunSummary) -> float | None:

        values = []
        for run in side_runs(side):
            noise, scale = run.noise, _scale(run, basis)
            if noise is None or scale is None or noise.cpu_means is None:
                return None
            values.append(scale * float(np.mean(noise.cpu_means)))
        return fmean(values)

    before, after = per_step(a), per_step(b)
    if before is None or after is None or before <= 0:
        return None
    return after / before - 1
