"""Synthetic runs for tests and benchmarks, written by the production span builder and local-copy writer.

A :class:`SyntheticStep` says in seconds what one rank's step looked like. It becomes the
:class:`~traceml_otel.step_records.StepRecord` the capture side would hand the emitter, and from there
the emitter's own code writes it: :class:`~traceml_otel.emit.spans.StepSpanBuilder` builds the spans
and :class:`~traceml_otel.emit.local_copy.LocalCopyWriter` writes the ``rank-R.traces.jsonl`` lines,
with the resource and scope the emitter uses. So the analyzer's tests read exactly what production
writes; what production cannot write (odd ids, corrupt lines, foreign documents), a test writes
itself.

This lives under ``tests/`` (beside ``local_copy_reader.py``), not in the package: it is test
support, it imports the emitter (OTel SDK), and the analysis-only install must not need it.
Benchmarks put the repository root on ``sys.path`` to import it.

Example::

    steps = [SyntheticStep(rank=0, step=n, input_wait=0.02) for n in range(50)]
    write_run(tmp_path / "run-1", "run-1", steps)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.local_copy import LocalCopyWriter, traces_data_json, traces_data_prefix
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder, StepSpans
from traceml_otel.emit.step_table import StepTable
from traceml_otel.emit.worker import build_resource
from traceml_otel.launch.launcher import end_status_of
from traceml_otel.step_records import CollectiveTiming, LoaderSettings, PhaseTiming, StepRecord
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.manifest import Manifest, write_manifest

START_NS = 1_700_000_000_000_000_000
"""Where a synthetic run's first step starts (epoch nanoseconds)."""
SERVICE = "traceml-synthetic"
HOST = "synthetic"
H2D_BYTES = 4096
"""The bytes every synthetic H2D copy moves."""
BUCKET_BYTES = 1 << 20
"""The bytes of each synthetic DDP gradient bucket."""


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


@dataclass(frozen=True, slots=True)
class SyntheticStep:
    """One rank's step. Phase times are seconds; ``None`` means no span for that phase.

    The step lasts the sum of its phases plus ``residual`` unless ``traced`` says otherwise; the
    phases run back to back from the step's start. ``forward_calls`` splits the forward time into
    that many equal calls. ``ddp_wait`` adds two DDP gradient buckets to backward, the last handed
    over ``ddp_wait`` seconds before backward ends and completing as it ends: that wait is the
    step's exposed communication, part of ``backward``. ``gpu=True`` gives every duration a
    CUDA-event timing equal to its CPU one, so the step is GPU-timed. ``world_size`` belongs to the
    rank: every step of a rank must give the same one. With ``num_workers`` set the step carries
    DataLoader settings, as the first step after a loader with a new configuration does.
    """

    rank: int
    step: int
    input_wait: float | None = 0.001
    forward: float | None = 0.004
    backward: float | None = 0.008
    optimizer: float | None = 0.001
    h2d: float | None = None
    residual: float = 0.0005
    traced: float | None = None
    forward_calls: int = 1
    prefetch_h2d: float | None = None
    optimizer_steps: int = 1
    parallelism: str = "none"
    world_size: int = 1
    gpu: bool = False
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    memory_total: int | None = None
    error: str | None = None
    samples: int | None = None
    tokens: int | None = None
    num_workers: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    batch_size: int | None = None
    dataset: str | None = None
    ddp_wait: float | None = None

    def traced_time(self) -> float:
        """The step span's duration in seconds."""
        if self.traced is not None:
            return self.traced
        phases = (self.forward, self.backward, self.optimizer, self.h2d)
        return sum(p for p in phases if p is not None) + self.residual

    def record(self, start_ns: int) -> StepRecord:
        """The :class:`StepRecord` of this step, started at ``start_ns``."""
        gpu = self.gpu
        phases: list[PhaseTiming] = []
        offset = 0
        for phase, seconds in zip(c.PHASES, (self.forward, self.backward, self.optimizer, self.h2d),
                                  strict=True):
            if seconds is None:
                continue
            calls = self.forward_calls if phase == "forward" else 1
            for call in range(calls):
                duration = _ns(seconds / calls)
                phases.append(PhaseTiming(
                    phase=phase, call=call, start_ns=start_ns + offset, end_ns=start_ns + offset + duration,
                    gpu_offset_ns=offset if gpu else None, gpu_duration_ns=duration if gpu else None,
                    nbytes=H2D_BYTES if phase == "h2d" else None,
                ))
                offset += duration
        traced = _ns(self.traced_time())
        collectives = self._ddp_buckets(phases, start_ns)
        wait = None if self.input_wait is None else _ns(self.input_wait)
        loader = None
        if self.num_workers is not None:
            loader = LoaderSettings(
                num_workers=self.num_workers, pin_memory=self.pin_memory,
                persistent_workers=self.persistent_workers,
                prefetch_factor=self.prefetch_factor, batch_size=self.batch_size, dataset=self.dataset,
            )
        return StepRecord(
            step=self.step,
            start_ns=start_ns,
            end_ns=start_ns + traced,
            phases=tuple(phases),
            gpu_duration_ns=traced if gpu else None,
            input_wait_ns=wait,
            input_wait_gpu_ns=wait if gpu else None,
            input_fetches=0 if wait is None else 1,
            prefetch_h2d_ns=None if self.prefetch_h2d is None else _ns(self.prefetch_h2d),
            optimizer_steps=self.optimizer_steps,
            parallelism=self.parallelism,
            peak_allocated_bytes=self.peak_allocated,
            peak_reserved_bytes=self.peak_reserved,
            device_total_bytes=self.memory_total,
            exception_type=self.error,
            samples=self.samples,
            tokens=self.tokens,
            loader=loader,
            collectives=collectives,
        )

    def _ddp_buckets(self, phases: list[PhaseTiming], start_ns: int) -> tuple[CollectiveTiming, ...]:
        backward = next((p for p in phases if p.phase == "backward"), None)
        if self.ddp_wait is None or backward is None:
            return ()
        last_handed = backward.end_ns - _ns(self.ddp_wait)
        first_handed = (backward.start_ns + last_handed) // 2
        buckets = []
        for begin, end in ((first_handed, last_handed), (last_handed, backward.end_ns)):
            gpu = {"gpu_offset_ns": begin - start_ns, "gpu_duration_ns": end - begin} if self.gpu else {}
            buckets.append(CollectiveTiming("all_reduce", "ddp", begin, end, BUCKET_BYTES, False, **gpu))
        return tuple(buckets)


class SyntheticRank:
    """One rank as the emitter sees it: its span builder, resource and scope."""

    def __init__(self, run_id: str, rank: int, world_size: int, *, service: str = SERVICE,
                 cpus: int | None = None) -> None:
        self.run_id, self.rank, self.world_size = run_id, rank, world_size
        self.builder = StepSpanBuilder(RankInfo(
            run_id=run_id, rank=rank, local_rank=rank, world_size=world_size, node_rank=0, host=HOST,
            cpus=cpus,
        ))
        resource = build_resource(Hello(
            run_id=run_id, rank=rank, local_rank=rank, world_size=world_size, node_rank=0, host=HOST,
            pid=1000 + rank, anchor_ns=0, shutdown_timeout_s=10.0, service_name=service, cpus=cpus,
        ))
        # The emitter lets OTEL_SERVICE_NAME win; a test's run keeps its service whatever the shell says.
        self.resource: Resource = resource.merge(Resource({"service.name": service}))
        self.scope = InstrumentationScope(c.INSTRUMENTATION_SCOPE, __version__)

    def spans(self, step: SyntheticStep, start_ns: int) -> list[Any]:
        """The spans of ``step`` (the step span first), built by the production builder."""
        return self.build(step, start_ns).all()

    def build(self, step: SyntheticStep, start_ns: int) -> StepSpans:
        """The :class:`StepSpans` of ``step``, built by the production builder."""
        if step.rank != self.rank or step.world_size != self.world_size:
            raise ValueError(f"step {step.step} is for rank {step.rank} of {step.world_size}, "
                             f"not rank {self.rank} of {self.world_size}")
        return self.builder.build(step.record(start_ns))


def _ranks(
    run_id: str, steps: Iterable[SyntheticStep], start_ns: int, service: str, cpus: int | None,
) -> Iterator[tuple[SyntheticRank, SyntheticStep, int]]:
    """``(rank, step, start)``: each rank's steps back to back, an input wait before each."""
    ranks: dict[int, SyntheticRank] = {}
    clocks: dict[int, int] = {}
    for step in steps:
        rank = ranks.get(step.rank)
        if rank is None:
            rank = ranks[step.rank] = SyntheticRank(run_id, step.rank, step.world_size, service=service,
                                                    cpus=cpus)
        start = clocks.get(step.rank, start_ns) + _ns(step.input_wait or 0.0)
        yield rank, step, start
        clocks[step.rank] = start + _ns(step.traced_time())


def step_spans(
    run_id: str, step: SyntheticStep, start_ns: int, *, cpus: int | None = None
) -> list[dict[str, Any]]:
    """The OTLP JSON spans of one step (the ``traceml.step`` span first), as the local copy holds them."""
    rank = SyntheticRank(run_id, step.rank, step.world_size, cpus=cpus)
    line = json.loads(traces_data_json(rank.spans(step, start_ns), rank.resource, rank.scope))
    return line["resourceSpans"][0]["scopeSpans"][0]["spans"]


def traces_data(
    run_id: str, rank: int, spans: list[dict[str, Any]], service: str = SERVICE
) -> dict[str, Any]:
    """One OTLP ``TracesData`` of ``spans`` (dicts, possibly altered by a test) under rank ``rank``'s
    resource and scope, as the local-copy writer encodes them."""
    emitter = SyntheticRank(run_id, rank, 1, service=service)
    prefix = traces_data_prefix(emitter.resource, emitter.scope)
    return json.loads(prefix + ",".join(json.dumps(span) for span in spans) + "]}]}]}")


def otlp_lines(
    run_id: str,
    steps: Iterable[SyntheticStep],
    *,
    steps_per_line: int = 8,
    service: str = SERVICE,
    start_ns: int = START_NS,
    cpus: int | None = None,
) -> Iterator[tuple[int, str]]:
    """``(rank, line)`` pairs: each line one ``TracesData`` of up to ``steps_per_line`` steps of a rank,
    encoded by the local-copy encoder."""
    pending: dict[int, tuple[SyntheticRank, list[Any], int]] = {}
    for rank, step, start in _ranks(run_id, steps, start_ns, service, cpus):
        _, spans, count = pending.get(step.rank, (rank, [], 0))
        spans.extend(rank.spans(step, start))
        pending[step.rank] = (rank, spans, count + 1)
        if count + 1 == steps_per_line:
            del pending[step.rank]
            yield step.rank, traces_data_json(spans, rank.resource, rank.scope)
    for number, (rank, spans, _) in pending.items():
        yield number, traces_data_json(spans, rank.resource, rank.scope)


def write_ranks(
    run_dir: Path,
    run_id: str,
    steps: Iterable[SyntheticStep],
    *,
    steps_per_line: int = 8,
    service: str = SERVICE,
    start_ns: int = START_NS,
    cpus: int | None = None,
    table: bool = True,
) -> dict[int, int]:
    """Write each rank's ``rank-R.traces.jsonl`` with the local-copy writer, ``steps_per_line`` steps a
    line (as the emitter writes a batch), and (``table``) its step table ``rank-R.steps.csv`` with
    the emitter's table writer, closed with its record; returns the steps written per rank."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[int, tuple[LocalCopyWriter, StepTable | None, list[StepSpans]]] = {}

    def flush(rank: int) -> None:
        local, rows, built = files[rank]
        local.write([span for spans in built for span in spans.all()], steps=len(built))
        if rows is not None:
            rows.write(built)
        built.clear()

    try:
        for rank, step, start in _ranks(run_id, steps, start_ns, service, cpus):
            if step.rank not in files:
                path = run_dir / c.traces_file_name(step.rank)
                writer = StepTable(run_dir, run_id, step.rank, _raise, service) if table else None
                files[step.rank] = (LocalCopyWriter(path, rank.resource, rank.scope), writer, [])
            built = files[step.rank][2]
            built.append(rank.build(step, start))
            if len(built) == steps_per_line:
                flush(step.rank)
        for number in files:
            flush(number)
    finally:
        for local, rows, _ in files.values():
            local.close()
            if rows is not None:
                rows.close()
    return {rank: local.steps_written for rank, (local, _, _) in files.items()}


def _raise(message: str) -> None:
    raise OSError(message)


def write_manifest_of(run_dir: Path, run_id: str, world_size: int, *, exit_code: int = 0) -> None:
    """``manifest.json`` as ``traceml run`` leaves it after the script exited with ``exit_code``."""
    write_manifest(run_dir, Manifest(  # the one manifest writer; raises OSError when it cannot write
        run_id=run_id,
        run_name="synthetic",
        command=("python", "synthetic.py"),
        launcher=("python", "synthetic.py"),
        world_size=world_size,
        nnodes=1,
        node_rank=0,
        start_time=1_700_000_000.0,
        end_time=1_700_000_100.0,
        exit_code=exit_code,
        end_status=end_status_of(exit_code),
    ))


def write_run(
    run_dir: Path,
    run_id: str,
    steps: Iterable[SyntheticStep],
    *,
    steps_per_line: int = 8,
    manifest: bool = True,
    service: str = SERVICE,
    cpus: int | None = None,
) -> Path:
    """Write a local-copy run directory: ``rank-R.traces.jsonl`` per rank and ``manifest.json``.

    ``cpus`` is every rank's CPU count (``traceml.host.cpus``, written on its first step and on
    steps that carry loader settings, as the emitter does).
    """
    steps = list(steps)
    write_ranks(run_dir, run_id, steps, steps_per_line=steps_per_line, service=service, cpus=cpus)
    if manifest:
        world = max((max(s.world_size, s.rank + 1) for s in steps), default=1)
        write_manifest_of(run_dir, run_id, world)
    return run_dir
