"""One run's own variability, for ``traceml compare``: batch means of its step times.

Step times are autocorrelated (a busy minute on the machine slows a run of consecutive steps), so the
standard error of their mean from the steps one by one is far too small. The method of batch means
splits the steady steps (after the warm-up that drift also skips) into ``k`` consecutive blocks of
``b`` steps, with ``b`` about ``sqrt(n)`` (at most :data:`MAX_BLOCKS` blocks); the blocks' means are
nearly independent, so ``sd(block means) / sqrt(k)`` with ``k - 1`` degrees of freedom estimates the
error of the run's mean. While the block means still correlate at lag 1 by more than
:data:`MAX_LAG1`, the blocks are doubled.

When the run folder holds the training thread's CPU samples (``rank-R.cpu.json``,
:mod:`traceml_otel.emit.trainer_cpu`), the run also gets batch means of its on-CPU time per step
and the share of wall time it waited, runnable, for a CPU: compare uses them to tell a busier machine
from slower code. The record is bounded (at most 64 numbers per list): a run of any length costs its
report a few KB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from traceml_otel.analyze.drift import warmup_steps
from traceml_otel.errors import TracemlError
from traceml_otel.wire.cpu_record import CpuRecord, read_cpu_record

METHOD = "batch means"
MAX_BLOCKS = 64
MIN_BLOCKS = 4
"""Fewer blocks than this: no estimate of the run's own noise (said in compare)."""
MIN_BLOCK = 3
MAX_LAG1 = 0.3
MAX_CPU_FILES = 1024
FAST_QUANTILE = 0.10
"""The quantile of a block's step times kept as its fast-step time: on a shared 2-core VM, the 10th
percentile of identical runs' step times varied by 0.8 % (standard deviation of the log) from run to
run where their means varied by 11 % (``benchmarks/compare_aa.py``, 5 runs per side, quiet machine)."""


@dataclass(frozen=True, slots=True)
class RunNoise:
    """A run's steady steps as block means (seconds per step), and per block its CPU wait and on-CPU
    shares of wall time when the run recorded them."""

    method: str
    steps: int
    """Steps in the blocks (after the warm-up)."""
    warmup: int
    """Leading steps left out as warm-up."""
    block_size: int
    block_means: tuple[float, ...]
    block_first_steps: tuple[int, ...]
    block_last_steps: tuple[int, ...]
    cpu_block_means: tuple[float, ...] = ()
    """On-CPU time of the training thread per loop step (seconds), per block of the CPU sampler's
    windows over the steady steps (empty: not recorded)."""
    cpu_source: str = ""
    """``schedstat`` (on-CPU and run-queue wait) or empty."""
    cpu_block_load: tuple[float, ...] = ()
    """Per block of ``cpu_block_means``: CPUs the rest of the machine kept busy beside the training
    thread (``/proc/stat``), on average; empty when not recorded."""
    wait_share_run: float | None = None
    """The share of wall time over the steady steps the training thread waited, runnable, for a CPU."""
    machine_cpus: int = 0
    """The machine's CPU count, which ``cpu_block_load`` is out of (0: unknown)."""
    block_fast: tuple[float, ...] = ()
    """Per block of ``block_means``: its :data:`FAST_QUANTILE` step time (seconds; empty: not recorded).
    Interference from the rest of the machine only adds time, so a run's fast steps move with its code
    and far less with the machine's moods than its mean does."""
    cpu_block_others: tuple[float, ...] = ()
    """Per block of ``cpu_block_means``: CPUs that work outside the training process and its children
    kept busy (another job, a hog); ``cpu_block_load`` less the process's own other threads and its
    DataLoader workers. Empty when the process's CPU was not recorded."""

    @property
    def mean(self) -> float:
        import numpy as np

        return float(np.mean(self.block_means))

    @property
    def cpu_means(self) -> tuple[float, ...] | None:
        """The training thread's on-CPU time per loop step per block (``None``: not recorded)."""
        return self.cpu_block_means if len(self.cpu_block_means) >= MIN_BLOCKS else None

    @property
    def wait_share(self) -> float | None:
        """The run's share of wall time spent waiting for a CPU; ``None``: not recorded."""
        return self.wait_share_run if self.cpu_means is not None else None


def run_noise(step_numbers: Sequence[int], series: Sequence[float]) -> RunNoise | None:
    """Batch means of a run's per-step times (median over ranks); ``None`` with too few steps or a
    value that is not a finite positive number."""
    import numpy as np

    values = np.asarray(series, dtype=float)
    if len(values) < MIN_BLOCKS * MIN_BLOCK or not np.all(np.isfinite(values)) or np.any(values < 0):
        return None
    skip = min(warmup_steps(list(values)), len(values) - MIN_BLOCKS * MIN_BLOCK)
    steady = values[skip:]
    numbers = list(step_numbers)[skip:]
    n = len(steady)
    size = max(MIN_BLOCK, math.ceil(math.sqrt(n)), math.ceil(n / MAX_BLOCKS))
    while True:
        k = n // size
        means = steady[: k * size].reshape(k, size).mean(axis=1)
        if k < 2 * MIN_BLOCKS or _lag1(means) <= MAX_LAG1:
            break
        size *= 2
    if k < MIN_BLOCKS:
        return None
    start = n - k * size  # the blocks end with the run: leading steady steps beyond k * size are left out
    blocks = steady[start:].reshape(k, size)
    means = blocks.mean(axis=1)
    fast = np.quantile(blocks, FAST_QUANTILE, axis=1)
    firsts = tuple(int(numbers[start + i * size]) for i in range(k))
    lasts = tuple(int(numbers[start + (i + 1) * size - 1]) for i in range(k))
    return RunNoise(METHOD, k * size, skip + start, size, tuple(float(m) for m in means), firsts, lasts,
                    block_fast=tuple(float(f) for f in fast))


def _lag1(values: Any) -> float:
    import numpy as np

    if len(values) < 3 or float(np.std(values)) == 0.0:
        return 0.0
    return float(np.corrcoef(values[:-1], values[1:])[0, 1])


def read_cpu_records(run_dir: Path, run_id: str) -> tuple[list[CpuRecord], list[str]]:
    """The run folder's ``rank-R.cpu.json`` records of ``run_id`` and problems reading them (bounded)."""
    records: list[CpuRecord] = []
    problems: list[str] = []
    for path in sorted(run_dir.glob("rank-*.cpu.json"))[:MAX_CPU_FILES]:
        if path.is_symlink():
            problems.append(f"{path.name}: a symbolic link; not followed")
            continue
        try:
            record = read_cpu_record(path)
        except (OSError, ValueError) as error:
            problems.append(f"{path.name}: {str(error)[:120]}")
            continue
        if not record.run_id or not run_id or record.run_id == run_id:
            records.append(record)
    return records, problems


def with_cpu(noise: RunNoise, records: Sequence[CpuRecord]) -> RunNoise:
    """``noise`` with the training thread's on-CPU time per step from the CPU samples of its steady
    steps, and the share of wall time it waited for a CPU.

    The sampler's windows (about 0.1 s each) are the blocks: per window, on-CPU ns / steps closed,
    grouped into at most :data:`MAX_BLOCKS` batch means. A rank's samples measure its whole loop (a
    step and the time until the next), so the time is per step of the loop. With several ranks, the
    rank whose on-CPU time per step is the median is taken."""
    import numpy as np

    series = []
    for record in records:
        found = _cpu_series(record, noise.block_first_steps[0], noise.block_last_steps[-1] + 1)
        if found is not None:
            series.append(found)
    if not series:
        return noise
    series.sort(key=lambda item: float(np.mean(item[0])))
    cpu, load, wait, source, cpus, others = series[(len(series) - 1) // 2]
    return replace(noise, cpu_block_means=cpu, cpu_block_load=load, cpu_source=source, wait_share_run=wait,
                   machine_cpus=cpus, cpu_block_others=others)


def _cpu_series(
    record: CpuRecord, first: int, end: int
) -> tuple[tuple[float, ...], tuple[float, ...], float | None, str, int, tuple[float, ...]] | None:
    """(on-CPU s/step per block, the rest of the machine's busy CPUs per block, share of wall time
    waited for a CPU, source, the machine's CPU count, CPUs busy outside the process per block) of one
    rank's samples."""
    rows = [r for r in record.samples if first <= r[0] <= end]
    if len(rows) < MIN_BLOCKS + 1 or record.source not in ("schedstat", "stat"):
        return None
    unknown = -(10**18)
    windows = []  # (steps, wall ns, wait ns, cpu ns, machine busy ns, the process's and its children's ns)
    pending = None
    for before, after in pairwise(rows):
        own = unknown
        if min(before[4], after[4]) >= 0:
            own = after[4] - before[4] + (after[6] - before[6] if min(before[6], after[6]) >= 0 else 0)
        delta = (after[0] - before[0], after[1] - before[1], after[3] - before[3], after[2] - before[2],
                 after[5] - before[5] if before[5] >= 0 and after[5] >= 0 else unknown, own)
        if pending is not None:
            delta = tuple(x + y for x, y in zip(pending, delta, strict=True))
        if delta[0] <= 0 or delta[1] <= 0:
            pending = delta
            continue
        pending = None
        windows.append(delta)
    if len(windows) < MIN_BLOCKS:
        return None
    size = max(1, math.ceil(len(windows) / MAX_BLOCKS))
    cpu, load, others = [], [], []
    for start in range(0, len(windows) - size + 1, size):
        group = windows[start:start + size]
        on_cpu = sum(w[3] for w in group)
        cpu.append(on_cpu / sum(w[0] for w in group) / 1e9)
        load.append(max(0.0, (sum(w[4] for w in group) - on_cpu) / sum(w[1] for w in group)))
        outside = sum(w[4] for w in group) - sum(w[5] for w in group)  # busy CPUs less the process tree's
        others.append(max(0.0, outside / sum(w[1] for w in group)))
    total_wall = sum(w[1] for w in windows)
    waited = record.source == "schedstat" and total_wall > 0
    share = sum(w[2] for w in windows) / total_wall if waited else None
    known_load = tuple(load) if all(w[4] >= 0 for w in windows) else ()
    known_others = tuple(others) if known_load and all(w[5] >= 0 for w in windows) else ()
    return (tuple(cpu), known_load, None if share is None else min(1.0, share), record.source,
            record.machine_cpus, known_others)


def noise_json(noise: RunNoise | None) -> dict[str, object] | None:
    """The report's ``noise`` section (docs/report-schema.md); ``None`` without an estimate."""
    if noise is None:
        return None
    return {
        "method": noise.method, "steps": noise.steps, "warmup_steps": noise.warmup,
        "block_size": noise.block_size, "block_means_s": list(noise.block_means),
        "block_first_steps": list(noise.block_first_steps), "block_last_steps": list(noise.block_last_steps),
        "on_cpu_means_s": list(noise.cpu_block_means), "machine_load_cpus": list(noise.cpu_block_load),
        "cpu_wait_share": noise.wait_share_run, "cpu_source": noise.cpu_source or None,
        "machine_cpus": noise.machine_cpus or None, "block_fast_s": list(noise.block_fast),
        "other_work_cpus": list(noise.cpu_block_others),
    }


class NoiseFormatError(TracemlError, ValueError):
    """A report's ``noise`` section that is malformed (a non-finite number, wrong types)."""


def noise_from_json(raw: object) -> RunNoise | None:
    """A report's ``noise`` section; ``None`` when absent; raises :class:`NoiseFormatError` when a number
    in it is not finite or the lists do not agree."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise NoiseFormatError("'noise' is not an object")

    def floats(name: str, limit: float = math.inf) -> tuple[float, ...]:
        items = raw.get(name) or []
        if not isinstance(items, list) or len(items) > MAX_BLOCKS:
            raise NoiseFormatError(f"noise.{name} is not a list of at most {MAX_BLOCKS} numbers")
        out = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
                raise NoiseFormatError(f"noise.{name} holds {str(item)[:20]!s}, not a finite number")
            if item < 0 or item > limit:
                raise NoiseFormatError(f"noise.{name} holds {item:g}, out of range")
            out.append(float(item))
        return tuple(out)

    means = floats("block_means_s")
    firsts = tuple(int(v) for v in floats("block_first_steps"))
    lasts = tuple(int(v) for v in floats("block_last_steps"))
    cpus, load = floats("on_cpu_means_s"), floats("machine_load_cpus", 4096.0)
    fast = floats("block_fast_s")
    if fast and len(fast) != len(means):
        raise NoiseFormatError("noise.block_fast_s and block_means_s of different lengths")
    if load and len(load) != len(cpus):
        raise NoiseFormatError("noise.machine_load_cpus and on_cpu_means_s of different lengths")
    others = floats("other_work_cpus", 4096.0)
    if others and len(others) != len(cpus):
        raise NoiseFormatError("noise.other_work_cpus and on_cpu_means_s of different lengths")
    size = raw.get("block_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1 or len(means) < MIN_BLOCKS:
        raise NoiseFormatError("noise.block_size or block_means_s malformed")
    if len(firsts) != len(means) or len(lasts) != len(means):
        raise NoiseFormatError("noise lists of different lengths")
    share = raw.get("cpu_wait_share")
    number = isinstance(share, int | float) and not isinstance(share, bool)
    if share is not None and (not number or not 0 <= share <= 1):
        raise NoiseFormatError("noise.cpu_wait_share is not a share")
    steps, warmup = raw.get("steps"), raw.get("warmup_steps")
    source = raw.get("cpu_source")
    machine = raw.get("machine_cpus")
    machine_cpus = machine if isinstance(machine, int) and not isinstance(machine, bool) else 0
    machine_cpus = machine_cpus if 0 < machine_cpus <= 1 << 16 else 0
    return RunNoise(
        str(raw.get("method", METHOD))[:40], steps if isinstance(steps, int) else len(means) * size,
        warmup if isinstance(warmup, int) else 0, size, means, firsts, lasts, cpus,
        source[:20] if isinstance(source, str) else "", load, None if share is None else float(share),
        machine_cpus, fast, others,
    )
