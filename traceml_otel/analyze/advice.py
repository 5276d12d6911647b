"""Advice that fits the run: the INPUT_BOUND "Next" line, from the DataLoader settings and CPU count
each rank recorded once (``traceml.dataloader.*``, ``traceml.host.cpus``); and no mixed-precision
advice to a run already in reduced precision (``precision`` in ``rank-R.time.json``); and the
workers-fill-every-CPU tip checked against the workers' measured CPU use (``rank-R.cpu.json``).

Without recorded settings (a plain iterable, or an older run) the generic advice stands.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze.findings import Evidence, Finding
from traceml_otel.analyze.kinds import Clock, StepKind
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import RankHost
from traceml_otel.wire.cpu_record import CpuRecord

COMPUTE_ADVICE = (
    "The time goes into the model itself. Gains come from the model: mixed precision, torch.compile, "
    "a fused optimizer, a larger batch per device, or cheaper layers."
)
COMPUTE_ADVICE_REDUCED = (
    "The time goes into the model itself, already in reduced precision ({precision}). Gains come from "
    "the model: torch.compile, a fused optimizer, a larger batch per device, or cheaper layers."
)
MEMORY_PRESSURE_ADVICE = (
    "Lower the batch size, use activation checkpointing or mixed precision, or shard states (FSDP/ZeRO)."
)
MEMORY_PRESSURE_ADVICE_REDUCED = (
    "Lower the batch size, use activation checkpointing, or shard states (FSDP/ZeRO); the run is already "
    "in reduced precision ({precision})."
)
_WITHOUT_MIXED_PRECISION = {COMPUTE_ADVICE: COMPUTE_ADVICE_REDUCED,
                            MEMORY_PRESSURE_ADVICE: MEMORY_PRESSURE_ADVICE_REDUCED}

GENERIC_INPUT_ADVICE = (
    "Feed the model faster: more DataLoader workers (num_workers), pin_memory=True and persistent "
    "workers, prefetching, or moving decoding and augmentation out of the training loop. Check the "
    "storage read speed."
)
CHEAPER_SAMPLES = (
    "make each sample cheaper (decode or augment once and cache, smaller files, a faster image "
    "library, augmentation on the GPU) and check the storage read speed"
)
IN_MEMORY_DATASETS = frozenset({"TensorDataset", "StackDataset", "list", "tuple"})
"""Datasets whose samples are already in memory: nothing is read or decoded per sample."""
CHEAPER_IN_MEMORY = (
    "the samples are already in memory ({dataset}), so the time goes to indexing and collating them "
    "one by one: fetch whole batches at once (index the tensors with a batch of indices, e.g. a "
    "BatchSampler as the sampler with batch_size=None, or slice them yourself)"
)


SATURATED = "its workers already take every CPU, so the CPUs are the limit"
"""The INPUT_BOUND tip where the workers and the training loop are as many as the CPUs (counted)."""
MIN_READ_SPAN_NS = 1_000_000_000
"""The children's readings must span this long (they are taken about once a second)."""
IDLE_CPU_SHARE = 0.75
"""Below this much of a CPU used per DataLoader worker (``rank-R.cpu.json``, :func:`worker_cpu_use`),
the workers that count as filling every CPU were not using them: they wait (storage, network,
sleeps), and more of them overlap the waits."""


def _loader_of(hosts: Sequence[RankHost]) -> RankHost | None:
    """The first rank (by number) that recorded its loader; ranks of one job share the script."""
    return next((h for h in hosts if h.has_loader), None)


def _cpus_per_rank(host: RankHost, hosts: Sequence[RankHost]) -> int | None:
    """Usable CPUs per rank: a node's CPUs are shared by its ranks (we count ranks that reported)."""
    if host.cpus is None:
        return None
    return max(1, host.cpus // max(1, len(hosts)))


def _first_workers(cpus: int | None) -> str:
    """How many workers to start with, for the CPUs one rank has (one stays with the training loop)."""
    if cpus is None:
        return "load in worker processes: set num_workers"
    if cpus <= 1:
        return ("load in a worker process (num_workers=1), though with one CPU it shares that CPU with "
                "training; better, make samples cheaper")
    if cpus == 2:
        return "load in a worker process: set num_workers=1 (one CPU loads, the other trains)"
    return f"load in worker processes: set num_workers to between 2 and {cpus - 1} here"


def input_bound_advice(hosts: Sequence[RankHost], clock: Clock, worker_use: float | None = None) -> str:
    """The Next line of INPUT_BOUND for the loader the run actually used; ``worker_use``: its workers'
    measured CPU use (:func:`worker_cpu_use`), which decides whether workers that count as filling every
    CPU really do."""
    host = _loader_of(hosts)
    if host is None:
        return GENERIC_INPUT_ADVICE
    workers = host.num_workers or 0
    cpus = _cpus_per_rank(host, hosts)
    have = f"The DataLoader has num_workers={workers}"
    if cpus is not None:
        have += f" for {cpus} CPU{'s' if cpus != 1 else ''}" + (" per rank" if len(hosts) > 1 else "")
    tips: list[str] = []
    cheaper = CHEAPER_SAMPLES
    if host.dataset in IN_MEMORY_DATASETS:
        cheaper = CHEAPER_IN_MEMORY.format(dataset=host.dataset)
    saturated = workers > 0 and cpus is not None and workers >= cpus - 1
    if workers == 0:
        tips.append(_first_workers(cpus))
    elif saturated:
        tips.append(_saturated_tip(worker_use, cheaper))
    else:
        more = f" (up to about {cpus - 1})" if cpus is not None else ""
        tips.append(f"try more workers{more}")
    if workers > 0 and not host.persistent_workers:
        tips.append("persistent_workers=True, so workers are not restarted every epoch")
    if workers > 0 and host.prefetch_factor is not None and host.prefetch_factor < 4:
        tips.append(f"a larger prefetch_factor (now {host.prefetch_factor})")
    if clock is Clock.GPU and not host.pin_memory:
        tips.append("pin_memory=True")
    if not saturated:
        tips.append(cheaper)
    advice = "; ".join(tips)
    return f"{have}. {advice[0].upper()}{advice[1:]}."


def _saturated_tip(worker_use: float | None, cheaper: str) -> str:
    """The tip for workers that count as filling every CPU: the CPUs are the limit, unless their measured
    use says they mostly wait (then more workers overlap the waits)."""
    if worker_use is None:
        return f"{SATURATED}: {cheaper}"
    share = f"{worker_use:.0%}"
    if worker_use >= IDLE_CPU_SHARE:
        return (f"{SATURATED} (measured: each worker on a CPU or waiting for one {share} of the time): "
                f"{cheaper}")
    return (f"its workers count as filling every CPU, yet each was on a CPU or waiting for one only {share} "
            "of the time (measured): they wait more than they compute (storage, network, sleeps), so more "
            f"workers overlap those waits; also {cheaper}")


def for_precision(analysis: RunAnalysis, precision: str) -> RunAnalysis:
    """The analysis with no finding advising mixed precision when the run was seen training in reduced
    precision (``precision``: ``autocast cuda bf16``, ``bf16 weights``; empty: none seen, unchanged)."""
    if not precision:
        return analysis

    def fitted(finding: Finding) -> Finding:
        reduced = _WITHOUT_MIXED_PRECISION.get(finding.next)
        return replace(finding, next=reduced.format(precision=precision)) if reduced else finding

    step = replace(analysis.step, primary=fitted(analysis.step.primary),
                   issues=tuple(fitted(f) for f in analysis.step.issues))
    memory = replace(analysis.memory, findings=tuple(fitted(f) for f in analysis.memory.findings))
    return replace(analysis, step=step, memory=memory)


def worker_cpu_use(records: Sequence[CpuRecord], hosts: Sequence[RankHost]) -> float | None:
    """How much of a CPU each DataLoader worker used while the ranks trained (the median over ranks), or
    ``None`` where it cannot be told (no workers, no readings).

    Measured (``rank-R.cpu.json``'s children's on-CPU and CPU-wait time: the trainer's descendants
    but its emitter, between the first and the last reading; a worker that waited for a CPU wanted it)
    where the kernel lists them; else, for a single-process job only, the machine's busy CPU time
    beside the training process (other processes on the machine count as the workers' there, so a busy
    machine never reads as idle workers; ranks sharing a node cannot be told apart, and a process
    confined to fewer CPUs than its machine has is not judged)."""
    workers = {host.rank: host.num_workers for host in hosts if host.num_workers}
    direct = [use for use in (_children_use(r, workers.get(r.rank)) for r in records) if use is not None]
    if direct:
        return statistics.median(direct)
    if len(records) != 1 or len(hosts) != 1:
        return None
    record, host = records[0], hosts[0]
    count = workers.get(record.rank)
    samples = [s for s in record.samples if s[5] >= 0]
    if not count or record.machine_cpus <= 0 or host.cpus != record.machine_cpus or len(samples) < 2:
        return None
    elapsed = samples[-1][1] - samples[0][1]
    if elapsed <= 0:
        return None
    busy = (samples[-1][5] - samples[0][5]) / elapsed  # CPUs' worth busy, the whole machine
    trainer = (samples[-1][4] - samples[0][4]) / elapsed  # the training process (its threads)
    return max(0.0, busy - trainer) / count


def _children_use(record: CpuRecord, workers: int | None) -> float | None:
    """One rank's workers' CPU per worker, on-CPU plus waiting for a CPU (a worker held off by a busy
    machine wanted it), from its children's readings (``None``: too few readings)."""
    readings = [(s[1], s[6], max(0, s[7])) for s in record.samples if len(s) > 7 and s[6] >= 0]
    if not workers or len(readings) < 2 or readings[-1][0] - readings[0][0] < MIN_READ_SPAN_NS:
        return None
    (began, cpu_first, wait_first), (ended, cpu_last, wait_last) = readings[0], readings[-1]
    wanted = max(0, cpu_last - cpu_first) + max(0, wait_last - wait_first)
    return wanted / (ended - began) / workers


def for_cpu_use(analysis: RunAnalysis, use: float | None) -> RunAnalysis:
    """The analysis with the INPUT_BOUND advice built again with the workers' measured CPU use (``use``:
    :func:`worker_cpu_use`, read from the run folder after the diagnosis). The settings alone count the
    workers as filling every CPU once they are as many as the CPUs beside the training loop; a loader
    that mostly waits (reading storage, the network, sleeping) leaves those CPUs idle, and then more
    workers do help."""
    if use is None:
        return analysis
    plain = input_bound_advice(analysis.hosts, analysis.clock)
    measured = input_bound_advice(analysis.hosts, analysis.clock, use)
    if measured == plain:  # the workers do not count as filling every CPU: the measure changes nothing
        return analysis

    def checked(finding: Finding) -> Finding:
        if finding.kind != StepKind.INPUT_BOUND or finding.next != plain:
            return finding
        return replace(finding, next=measured,
                       evidence=(*finding.evidence, Evidence("worker_cpu_use", round(use, 3), "ratio")))

    step = replace(analysis.step, primary=checked(analysis.step.primary),
                   issues=tuple(checked(f) for f in analysis.step.issues))
    return replace(analysis, step=step)
