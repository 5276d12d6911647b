"""Fold spans into per-(rank, step) numbers as they stream past.

Sources decode the attributes :mod:`~traceml_otel.analyze.span_schema` names and hand each span to
:meth:`StepAssembler.add_span`; the assembler keeps only a few numbers per (run, rank, step), never
span objects, so a run of a million spans fits in a few hundred megabytes.
:meth:`StepAssembler.steps` freezes them into :class:`~traceml_otel.analyze.run_model.StepTiming`
records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from traceml_otel import contract as c
from traceml_otel.analyze.otlp_decode import (
    MAX_SECONDS,
    as_float,
    as_int,
    as_int_list,
    as_seconds,
    as_str,
    is_error_status,
    span_field,
    trace_id_hex,
)
from traceml_otel.analyze.run_model import RankHost, StepTiming
from traceml_otel.analyze.span_schema import (
    COLLECTIVE_SPAN,
    LOADER_ATTRIBUTES,
    SPAN_INDEX,
    STEP_SPAN,
    classify_by_attributes,
)
from traceml_otel.wire.sampling_threshold import adjusted_count, trace_state_threshold
from traceml_otel.wire.step_schema import H2D_BEFORE_STEP

_N = len(c.PHASES)
assert _N == 4, "_freeze spells out the four phases"
_H2D_BEFORE = tuple(str(f.attribute) for f in H2D_BEFORE_STEP)
"""The step span's attributes whose seconds sum into ``StepTiming.h2d_before_cpu`` (the schema's)."""


class _StepComm(NamedTuple):
    """A step span's collective totals (``traceml.communication.*``)."""

    calls: int | None
    bytes: int | None
    cpu: float | None
    gpu: float | None
    exposed_cpu: float | None
    exposed_gpu: float | None


_NO_COMM = _StepComm(None, None, None, None, None, None)


class _StepAccumulator:
    """Mutable numbers of one (rank, step) while spans arrive."""

    __slots__ = (
        "between",
        "calls",
        "comm",
        "comm_cpu",
        "comm_entries",
        "comm_gpu",
        "comm_work",
        "cpu",
        "cpus",
        "error",
        "gpu",
        "h2d_before",
        "has_step",
        "loader",
        "mem_total",
        "optimizer_steps",
        "parallelism",
        "peak_alloc",
        "peak_res",
        "samples",
        "skipped",
        "source",
        "start",
        "tokens",
        "trace_id",
        "traced_cpu",
        "traced_gpu",
        "wait_cpu",
        "wait_gpu",
        "weight",
        "world_size",
    )

    def __init__(self) -> None:
        self.weight = 1.0
        self.has_step = False
        self.trace_id = ""
        self.start = 0
        self.parallelism = "none"
        self.world_size: int | None = None
        self.traced_cpu: float | None = None
        self.traced_gpu: float | None = None
        self.wait_cpu: float | None = None
        self.wait_gpu: float | None = None
        self.h2d_before: float | None = None
        self.optimizer_steps: int | None = None
        self.skipped = 0
        self.peak_alloc: int | None = None
        self.peak_res: int | None = None
        self.mem_total: int | None = None
        self.error: str | None = None
        self.samples: int | None = None
        self.tokens: int | None = None
        self.loader: tuple[object, ...] | None = None
        self.cpus: int | None = None
        self.calls = [0] * _N
        self.cpu: list[float | None] = [0.0] * _N
        self.gpu: list[float | None] = [0.0] * _N
        self.comm: _StepComm | None = None
        self.comm_cpu = [0.0] * _N
        self.comm_gpu = [0.0] * _N
        self.comm_entries: tuple[int, ...] | None = None
        self.comm_work: tuple[int, ...] | None = None
        self.between: float | None = None
        self.source: str | None = None

    def __getstate__(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[object, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


class StepAssembler:
    """Collects spans of one or more runs into per-(rank, step) aggregates."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[tuple[int, int], _StepAccumulator]] = {}
        self.spans = 0
        self.foreign_spans = 0
        self.duplicate_steps = 0
        self.out_of_range_values = 0
        self._services: dict[str, set[str]] = {}

    def add_span(
        self,
        name: object,
        attrs: Mapping[str, object],
        span: Mapping[str, object],
        default_run_id: str = "",
    ) -> bool:
        """Fold one span in; returns False for a span that is not a traceml step or phase span.

        ``attrs`` holds the decoded :data:`~traceml_otel.analyze.span_schema.WANTED_ATTRIBUTES`;
        ``span`` the raw OTLP span, read for ``traceId``, ``startTimeUnixNano``, ``endTimeUnixNano``
        and ``status`` only when needed.
        Runs once per span of a read, so it stays lean.
        """
        index = SPAN_INDEX.get(name)
        if index is None:
            index = classify_by_attributes(attrs)
            if index is None:
                self.foreign_spans += 1
                return False
        try:
            key = (int(attrs[c.ATTR_RANK]), int(attrs[c.ATTR_STEP]))
        except (KeyError, TypeError, ValueError):
            rank, step = as_int(attrs.get(c.ATTR_RANK)), as_int(attrs.get(c.ATTR_STEP))
            if rank is None or step is None:
                self.foreign_spans += 1
                return False
            key = (rank, step)
        run_id = attrs.get(c.ATTR_RUN_ID) or default_run_id
        table = self._runs.get(run_id)
        if table is None:
            table = self._runs[str(run_id)] = {}
        acc = table.get(key)
        if acc is None:
            acc = table[key] = _StepAccumulator()
        self.spans += 1
        if index == STEP_SPAN:
            self._add_step(acc, attrs, span)
            return True
        if index == COLLECTIVE_SPAN:
            return True
        cpu = attrs.get(c.ATTR_PHASE_CPU_DURATION)
        if cpu.__class__ is not float or not -MAX_SECONDS <= cpu <= MAX_SECONDS:  # NaN, 1e400, 1e308 too
            cpu = self._seconds(cpu)
        gpu = attrs.get(c.ATTR_PHASE_GPU_DURATION)
        if gpu is not None and (gpu.__class__ is not float or not -MAX_SECONDS <= gpu <= MAX_SECONDS):
            gpu = self._seconds(gpu)
        if cpu is None and gpu is None:
            cpu = _span_seconds(
                span_field(span, "startTimeUnixNano", "start_time_unix_nano"),
                span_field(span, "endTimeUnixNano", "end_time_unix_nano"),
            )
        acc.calls[index] += 1
        total = acc.cpu[index]
        acc.cpu[index] = None if total is None or cpu is None else total + cpu
        total = acc.gpu[index]
        acc.gpu[index] = None if total is None or gpu is None else total + gpu
        if c.ATTR_PHASE_COMM_EXPOSED_CPU in attrs or c.ATTR_PHASE_COMM_EXPOSED_GPU in attrs:
            acc.comm_cpu[index] += self._seconds(attrs.get(c.ATTR_PHASE_COMM_EXPOSED_CPU)) or 0.0
            acc.comm_gpu[index] += self._seconds(attrs.get(c.ATTR_PHASE_COMM_EXPOSED_GPU)) or 0.0
        return True

    def _seconds(self, raw: object) -> float | None:
        """A duration attribute, or ``None``; a number beyond :data:`MAX_SECONDS` either way (1e308,
        infinite) is bad data and counted in ``out_of_range_values``."""
        seconds = as_seconds(raw)
        if seconds is None and raw is not None and as_float(raw) is not None:
            self.out_of_range_values += 1
        return seconds

    def _add_step(
        self, acc: _StepAccumulator, attrs: Mapping[str, object], span: Mapping[str, object]
    ) -> None:
        if acc.has_step:
            self.duplicate_steps += 1
        start_ns = span_field(span, "startTimeUnixNano", "start_time_unix_nano")
        end_ns = span_field(span, "endTimeUnixNano", "end_time_unix_nano")
        acc.has_step = True
        acc.trace_id = trace_id_hex(span_field(span, "traceId", "trace_id"))
        acc.start = as_int(start_ns) or 0
        acc.parallelism = as_str(attrs.get(c.ATTR_PARALLELISM)) or "none"
        acc.world_size = as_int(attrs.get(c.ATTR_WORLD_SIZE))
        acc.traced_cpu = self._seconds(attrs.get(c.ATTR_STEP_CPU_DURATION))
        acc.traced_gpu = self._seconds(attrs.get(c.ATTR_STEP_GPU_DURATION))
        if acc.traced_cpu is None and acc.traced_gpu is None:
            acc.traced_cpu = _span_seconds(start_ns, end_ns)
        acc.wait_cpu = self._seconds(attrs.get(c.ATTR_INPUT_WAIT_CPU))
        acc.wait_gpu = self._seconds(attrs.get(c.ATTR_INPUT_WAIT_GPU))
        h2d_before = None
        for name in _H2D_BEFORE:
            seconds = self._seconds(attrs.get(name))
            if seconds is not None:
                h2d_before = seconds if h2d_before is None else h2d_before + seconds
        acc.h2d_before = h2d_before
        acc.optimizer_steps = as_int(attrs.get(c.ATTR_OPTIMIZER_STEPS))
        acc.skipped = as_int(attrs.get(c.ATTR_OPTIMIZER_SKIPPED)) or 0
        acc.peak_alloc = as_int(attrs.get(c.ATTR_MEM_PEAK_ALLOCATED))
        acc.peak_res = as_int(attrs.get(c.ATTR_MEM_PEAK_RESERVED))
        acc.mem_total = as_int(attrs.get(c.ATTR_MEM_TOTAL))
        exception = as_str(attrs.get(c.ATTR_EXCEPTION_TYPE))
        acc.error = exception or ("error" if is_error_status(span) else None)
        acc.samples = as_int(attrs.get(c.ATTR_STEP_SAMPLES))
        acc.tokens = as_int(attrs.get(c.ATTR_STEP_TOKENS))
        acc.cpus = as_int(attrs.get(c.ATTR_HOST_CPUS))
        acc.between = as_float(attrs.get(c.ATTR_BETWEEN_STEPS_CPU))
        acc.source = as_str(attrs.get(c.ATTR_STEP_SOURCE))
        acc.weight = _sample_weight(attrs, span)
        if c.ATTR_LOADER_NUM_WORKERS in attrs:
            acc.loader = tuple(attrs.get(name) for name in LOADER_ATTRIBUTES)
        calls = as_int(attrs.get(c.ATTR_COMM_CALLS))
        if calls is not None:
            acc.comm = _StepComm(
                calls=calls,
                bytes=as_int(attrs.get(c.ATTR_COMM_BYTES)),
                cpu=self._seconds(attrs.get(c.ATTR_COMM_CPU)),
                gpu=self._seconds(attrs.get(c.ATTR_COMM_GPU)),
                exposed_cpu=self._seconds(attrs.get(c.ATTR_COMM_EXPOSED_CPU)),
                exposed_gpu=self._seconds(attrs.get(c.ATTR_COMM_EXPOSED_GPU)),
            )
            acc.comm_entries = as_int_list(attrs.get(c.ATTR_COMM_ENTRIES), c.MAX_COMM_ENTRIES)
            acc.comm_work = as_int_list(attrs.get(c.ATTR_COMM_WORK), c.MAX_COMM_ENTRIES)

    def note_service(self, run_id: str, service: str) -> None:
        """A resource of ``run_id`` (``""`` when the resource names none) had this ``service.name``."""
        self._services.setdefault(run_id, set()).add(service)

    def services(self, run_id: str) -> tuple[str, ...]:
        """The ``service.name`` values seen for ``run_id`` (or on resources that named no run)."""
        return tuple(sorted(self._services.get(run_id) or self._services.get("", set())))

    def merge(self, other: StepAssembler) -> None:
        """Fold another assembler's aggregates in (used to join files read in parallel)."""
        for run_id, names in other._services.items():
            self._services.setdefault(run_id, set()).update(names)
        self.spans += other.spans
        self.foreign_spans += other.foreign_spans
        self.duplicate_steps += other.duplicate_steps
        self.out_of_range_values += other.out_of_range_values
        for run_id, theirs in other._runs.items():
            mine = self._runs.get(run_id)
            if mine is None:
                self._runs[run_id] = theirs
                continue
            for key, acc in theirs.items():
                present = mine.get(key)
                mine[key] = acc if present is None else self._combine(present, acc)

    def _combine(self, mine: _StepAccumulator, theirs: _StepAccumulator) -> _StepAccumulator:
        if mine.has_step and theirs.has_step:
            self.duplicate_steps += 1
        base, extra = (theirs, mine) if theirs.has_step else (mine, theirs)
        for index in range(_N):
            base.calls[index] += extra.calls[index]
            a, b = base.cpu[index], extra.cpu[index]
            base.cpu[index] = None if a is None or b is None else a + b
            a, b = base.gpu[index], extra.gpu[index]
            base.gpu[index] = None if a is None or b is None else a + b
            base.comm_cpu[index] += extra.comm_cpu[index]
            base.comm_gpu[index] += extra.comm_gpu[index]
        return base

    def run_ids(self) -> list[str]:
        """Run ids seen, the one with most steps first."""
        return sorted(self._runs, key=lambda run: -len(self._runs[run]))

    def hosts(self, run_id: str) -> tuple[RankHost, ...]:
        """Per rank: the host's CPUs and the last DataLoader settings recorded (by step number)."""
        found: dict[int, RankHost] = {}
        for (rank, _step), acc in sorted(self._runs.get(run_id, {}).items()):
            if acc.cpus is None and acc.loader is None:
                continue
            host = found.get(rank) or RankHost(rank)
            if acc.cpus is not None:
                host = replace(host, cpus=acc.cpus)
            if acc.loader is not None:
                workers, pin, persistent, prefetch, batch, dataset = acc.loader
                host = replace(host, num_workers=as_int(workers), pin_memory=_as_bool(pin),
                               persistent_workers=_as_bool(persistent), prefetch_factor=as_int(prefetch),
                               batch_size=as_int(batch), dataset=as_str(dataset))
            found[rank] = host
        return tuple(host for _, host in sorted(found.items()))

    def steps(self, run_id: str) -> tuple[list[StepTiming], int]:
        """Frozen steps of ``run_id`` sorted by (rank, step), and how many had no step span."""
        table = self._runs.get(run_id, {})
        out: list[StepTiming] = []
        orphans = 0
        for (rank, step), acc in sorted(table.items()):
            if not acc.has_step:
                orphans += 1
                continue
            out.append(_freeze(run_id, rank, step, acc))
        return out, orphans


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _sample_weight(attrs: Mapping[str, object], span: Mapping[str, object]) -> float:
    """``1/p`` of a step the span budget sampled (its threshold attribute, else its tracestate's ``th``)."""
    th = attrs.get(c.ATTR_SAMPLING_THRESHOLD)
    if th is None:
        state = span_field(span, "traceState", "trace_state")
        th = trace_state_threshold(state) if isinstance(state, str) and state else None
    return (adjusted_count(th) or 1.0) if isinstance(th, str) else 1.0


def _span_seconds(start_ns: object, end_ns: object) -> float | None:
    start, end = as_int(start_ns), as_int(end_ns)
    if start is None or end is None or end < start:
        return None
    try:
        seconds = (end - start) / 1e9
    except OverflowError:  # integers beyond any float: not a real span
        return None
    return seconds if seconds <= MAX_SECONDS else None


def _freeze(run_id: str, rank: int, step: int, acc: _StepAccumulator) -> StepTiming:
    calls, cpu, gpu = acc.calls, acc.cpu, acc.gpu
    comm = acc.comm or _NO_COMM
    return StepTiming(
        run_id=run_id,
        rank=rank,
        step=step,
        trace_id=acc.trace_id,
        start_unix_nano=acc.start,
        parallelism=acc.parallelism,
        world_size=acc.world_size,
        traced_cpu=acc.traced_cpu,
        traced_gpu=acc.traced_gpu,
        input_wait_cpu=acc.wait_cpu,
        input_wait_gpu=acc.wait_gpu,
        h2d_before_cpu=acc.h2d_before,
        phase_calls=tuple(calls),
        phase_cpu=(
            cpu[0] if calls[0] else None,
            cpu[1] if calls[1] else None,
            cpu[2] if calls[2] else None,
            cpu[3] if calls[3] else None,
        ),
        phase_gpu=(
            gpu[0] if calls[0] else None,
            gpu[1] if calls[1] else None,
            gpu[2] if calls[2] else None,
            gpu[3] if calls[3] else None,
        ),
        optimizer_steps=acc.optimizer_steps,
        skipped_updates=acc.skipped,
        peak_allocated=acc.peak_alloc,
        peak_reserved=acc.peak_res,
        memory_total=acc.mem_total,
        error=acc.error,
        samples=acc.samples,
        tokens=acc.tokens,
        comm_calls=comm.calls,
        comm_bytes=comm.bytes,
        comm_cpu=comm.cpu,
        comm_gpu=comm.gpu,
        comm_exposed_cpu=comm.exposed_cpu,
        comm_exposed_gpu=comm.exposed_gpu,
        phase_comm_cpu=tuple(acc.comm_cpu),
        phase_comm_gpu=tuple(acc.comm_gpu),
        comm_entries=acc.comm_entries,
        comm_work=acc.comm_work,
        between_cpu=acc.between,
        source=acc.source,
        weight=acc.weight,
    )
