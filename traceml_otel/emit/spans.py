"""Turn step records into spans, placed on the right timeline.

The step span is a root in the trace derived from (run id, step)
(``contract.step_trace_id``), and phase spans are its children. Spans are built as light
:class:`SpanData` records, which the local copy (:mod:`traceml_otel.emit.local_copy`) and OTLP export
(:mod:`traceml_otel.emit.otlp_encode`) encode directly; :class:`ReadableSpanFactory` makes the SDK's
``ReadableSpan`` of one, which the tests use as the reference encoding.
Runs in the emitter process only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from traceml_otel import contract as c
from traceml_otel.emit.exposed_communication import CollectiveExposure, step_exposures, total, wait_entries
from traceml_otel.step_records import PhaseTiming, StepRecord
from traceml_otel.wire.step_schema import STEP_FIELDS, StepField

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NS = 1e-9


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Who emits: the run and the rank's place in it."""

    run_id: str
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    host: str
    cpus: int | None = None


@dataclass(slots=True)
class SpanData:
    """One finished span (kind INTERNAL, sampled), before any SDK object is made.

    Treated as immutable, not declared ``frozen``: four or more are built per step, and a frozen
    ``__init__`` costs about 0.5 us more each (see :mod:`traceml_otel.step_records`)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    error: str | None = None


@dataclass(slots=True)
class StepSpans:
    """The spans of one step on one rank; ``step`` is the root."""

    step: SpanData
    phases: tuple[SpanData, ...]
    collectives: tuple[SpanData, ...] = ()

    def all(self) -> list[SpanData]:
        return [self.step, *self.phases, *self.collectives]

    @property
    def trace_id(self) -> int:
        return self.step.trace_id

    @property
    def span_id(self) -> int:
        """The step span's id."""
        return self.step.span_id

    @property
    def count(self) -> int:
        """Spans of the step (the step span, its phases' and its collectives')."""
        return 1 + len(self.phases) + len(self.collectives)


def sampled_context(trace_id: int, span_id: int) -> SpanContext:
    """The SDK span context of one of our spans (local, always sampled)."""
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)


class ReadableSpanFactory:
    """Makes the SDK ``ReadableSpan`` the OTLP exporters take, for one resource and scope."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self.resource = resource
        self.scope = scope

    def convert(self, span: SpanData) -> ReadableSpan:
        parent = None
        if span.parent_span_id is not None:
            parent = sampled_context(span.trace_id, span.parent_span_id)
        status = Status(StatusCode.UNSET) if span.error is None else Status(StatusCode.ERROR, span.error)
        return ReadableSpan(
            name=span.name,
            context=sampled_context(span.trace_id, span.span_id),
            parent=parent,
            resource=self.resource,
            attributes=span.attributes,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=self.scope,
            status=status,
            start_time=span.start_ns,
            end_time=span.end_ns,
        )


class StepSpanBuilder:
    """Builds :class:`StepSpans` for one rank."""

    def __init__(self, rank: RankInfo) -> None:
        self._rank = rank
        self._random = random.Random()
        self._common = {c.ATTR_RUN_ID: rank.run_id, c.ATTR_RANK: rank.rank}
        self._first = True
        self._last_exit_ns: int | None = None
        """When this rank left its last collective (the work before the next one counts from here)."""

    def _span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    @property
    def rank(self) -> RankInfo:
        return self._rank

    @property
    def first(self) -> bool:
        """True until the first step is built (the first step span carries the host's CPU count)."""
        return self._first

    @property
    def random_bits(self) -> Callable[[int], int]:
        """The source of span ids (``random_bits(64) or 1``): a caller that draws ids for the spans of
        a step draws them from here, in the order :meth:`build` would (the step's, then each phase's)."""
        return self._random.getrandbits

    @property
    def last_exit_ns(self) -> int | None:
        """When this rank left its last collective (the next step's first wait entry counts from
        here); :mod:`traceml_otel.emit.step_lines` sets it when it works out a step's parts itself."""
        return self._last_exit_ns

    @last_exit_ns.setter
    def last_exit_ns(self, value: int | None) -> None:
        self._last_exit_ns = value

    def build(self, record: StepRecord, ids: tuple[int, ...] | tuple[int, list[int]] | None = None,
              collective_ids: list[int] | None = None) -> StepSpans:
        """The spans of one step; ``ids`` (the step span's id and each phase span's, in order) and
        ``collective_ids`` (each collective span's) when they were drawn already
        (:mod:`traceml_otel.emit.step_lines`), else drawn here, in that order."""
        trace_id = c.step_trace_id(self._rank.run_id, record.step)
        step_id = self._span_id() if ids is None else ids[0]
        on_gpu = record.gpu_duration_ns is not None
        exposures = step_exposures(record)
        phase_ids = ids[1] if ids is not None else [None] * len(record.phases)
        phases = tuple([
            self._phase_span(p, record, trace_id, step_id, on_gpu, exposures, phase_id)
            for p, phase_id in zip(record.phases, phase_ids, strict=True)
        ])
        collectives: tuple[SpanData, ...] = ()
        if exposures:
            groups = collective_groups(exposures, record, on_gpu)
            if collective_ids is None:
                collective_ids = [self._span_id() for _ in groups]
            collectives = tuple([
                SpanData(c.SPAN_COLLECTIVE, trace_id, span_id, step_id, start, end,
                         {**self._common, **attributes})
                for (attributes, start, end), span_id in zip(groups, collective_ids, strict=True)])
        end_ns = record.end_ns
        if on_gpu:
            end_ns = max(end_ns, record.start_ns + record.gpu_duration_ns, *(p.end_ns for p in phases))
        attributes = type(self)._step_attributes(self, record)
        if exposures:
            communication, self._last_exit_ns = step_communication(record, exposures, self._last_exit_ns)
            attributes.update(communication)
        step = SpanData(
            name=c.SPAN_STEP, trace_id=trace_id, span_id=step_id, parent_span_id=None,
            start_ns=record.start_ns, end_ns=end_ns, attributes=attributes,
            error=record.exception_type,
        )
        return StepSpans(step=step, phases=phases, collectives=collectives)

    _step_attributes: ClassVar[Callable[[StepSpanBuilder, StepRecord], dict[str, object]]]
    """The step span's attributes: made from the step schema at import time
    (:func:`step_attributes_source`)."""

    def _phase_span(
        self, phase: PhaseTiming, record: StepRecord, trace_id: int, parent_id: int, on_gpu: bool,
        exposures: list[CollectiveExposure], span_id: int | None,
    ) -> SpanData:
        start, end = phase.start_ns, phase.end_ns
        gpu_ns = phase.gpu_duration_ns
        attributes: dict[str, object] = {
            _RUN_ID: self._rank.run_id,
            _RANK: self._rank.rank,
            _STEP: record.step,
            _PHASE_NAME: phase.phase,
            _PHASE_CALL: phase.call,
            _PHASE_CPU: (end - start) * _NS,
        }
        if gpu_ns is not None:
            attributes[_PHASE_GPU] = gpu_ns * _NS
            if on_gpu and phase.gpu_offset_ns is not None:
                start = record.start_ns + phase.gpu_offset_ns
                end = start + gpu_ns
        if phase.nbytes is not None:
            attributes[c.ATTR_H2D_BYTES] = phase.nbytes
        if phase.module is not None:
            attributes[c.ATTR_MODULE_CLASS] = phase.module[:128]
        if exposures:
            attributes.update(phase_communication(phase, exposures))
        name = _PHASE_SPAN_NAMES.get(phase.phase) or f"traceml.{phase.phase}"
        if span_id is None:
            span_id = self._random.getrandbits(64) or 1
        return SpanData(name, trace_id, span_id, parent_id, start, end, attributes)


_RUN_ID, _RANK, _STEP = c.ATTR_RUN_ID, c.ATTR_RANK, c.ATTR_STEP
_PHASE_NAME, _PHASE_CALL = c.ATTR_PHASE_NAME, c.ATTR_PHASE_CALL
_PHASE_CPU, _PHASE_GPU = c.ATTR_PHASE_CPU_DURATION, c.ATTR_PHASE_GPU_DURATION
_PHASE_SPAN_NAMES = c.PHASE_SPAN_NAMES


_STEP_ATTRIBUTES = """
def _step_attributes(self, record):
    rank = self._rank
    attributes = {
        **self._common,
        c.ATTR_STEP: record.step,
        c.ATTR_LOCAL_RANK: rank.local_rank,
        c.ATTR_WORLD_SIZE: rank.world_size,
        c.ATTR_NODE_RANK: rank.node_rank,
        c.ATTR_HOST: rank.host,
        c.ATTR_PARALLELISM: record.parallelism,
        c.ATTR_CLOCK: record.clock,
        c.ATTR_STEP_CPU_DURATION: record.traced_cpu_ns * _NS,
        c.ATTR_OPTIMIZER_STEPS: record.optimizer_steps,
    }
OPTIONAL
    loader = record.loader
    if loader is not None:
        attributes[c.ATTR_LOADER_NUM_WORKERS] = loader.num_workers
        attributes[c.ATTR_LOADER_PIN_MEMORY] = loader.pin_memory
        attributes[c.ATTR_LOADER_PERSISTENT_WORKERS] = loader.persistent_workers
        if loader.prefetch_factor is not None:
            attributes[c.ATTR_LOADER_PREFETCH_FACTOR] = loader.prefetch_factor
        if loader.batch_size is not None:
            attributes[c.ATTR_LOADER_BATCH_SIZE] = loader.batch_size
        if loader.dataset is not None:
            attributes[c.ATTR_LOADER_DATASET] = loader.dataset
    if (self._first or loader is not None) and rank.cpus is not None:
        attributes[c.ATTR_HOST_CPUS] = rank.cpus
    self._first = False
    return attributes
"""


def step_attributes_source(fields: tuple[StepField, ...]) -> str:
    """The source of the step span's attributes: the ones every step span has (the schema's
    ``always`` fields among them), then each other step field with an attribute, in the schema's
    order, when measured (not ``None``; not 0 either where the schema says so) and scaled to the
    attribute's unit, then the loader's settings and the host's CPUs. Written out, one ``if`` per
    field: a loop over the fields, or a dict of them filtered after, costs ~2 us a step more."""
    lines = []
    for f in fields:
        if f.attribute is None or f.always:
            continue
        value = f"record.{f.record_field}"
        test = value if f.absent_when_zero else f"{value} is not None"
        scaled = value if f.scale == 1 else f"{value} * {f.scale!r}"
        lines += [f"    if {test}:", f"        attributes[{f.attribute!r}] = {scaled}"]
    return _STEP_ATTRIBUTES.replace("OPTIONAL", "\n".join(lines))


def _make_step_attributes() -> Callable[[StepSpanBuilder, StepRecord], dict[str, object]]:
    namespace: dict[str, object] = {"c": c, "_NS": _NS}
    exec(step_attributes_source(STEP_FIELDS), namespace)
    made = namespace["_step_attributes"]
    made.__qualname__ = "StepSpanBuilder._step_attributes"  # type: ignore[attr-defined]
    return made  # type: ignore[return-value]


StepSpanBuilder._step_attributes = _make_step_attributes()


def collective_groups(exposures: list[CollectiveExposure], record: StepRecord, on_gpu: bool,
                      ) -> list[tuple[dict[str, object], int, int]]:
    """One collective span per (source, kind), at most a dozen per step however many buckets or calls:
    each one's attributes after the run id and rank (step, source, kind, totals), its start and end."""
    groups: dict[tuple[str, str], list[CollectiveExposure]] = {}
    for exposure in exposures:
        groups.setdefault((exposure.timing.source, exposure.timing.kind), []).append(exposure)
    spans = []
    for (source, kind), members in groups.items():
        attributes: dict[str, object] = {
            c.ATTR_STEP: record.step,
            c.ATTR_COLLECTIVE_SOURCE: source,
            c.ATTR_COLLECTIVE_KIND: kind,
            **_totals(
                members, c.ATTR_COLLECTIVE_CALLS, c.ATTR_COLLECTIVE_BYTES, c.ATTR_COLLECTIVE_CPU,
                c.ATTR_COLLECTIVE_GPU, c.ATTR_COLLECTIVE_EXPOSED_CPU, c.ATTR_COLLECTIVE_EXPOSED_GPU,
            ),
        }
        timings = [m.timing for m in members]
        start = min(t.start_ns for t in timings)
        end = max(t.end_ns if t.end_ns is not None else t.start_ns for t in timings)
        offsets = [t.gpu_offset_ns for t in timings]
        durations = [t.gpu_duration_ns for t in timings]
        if on_gpu and None not in offsets and None not in durations:
            start = record.start_ns + min(offsets)  # type: ignore[type-var]
            end = record.start_ns + max(o + d for o, d in zip(offsets, durations, strict=True))
        spans.append((attributes, start, max(start, end)))
    return spans


def step_communication(record: StepRecord, exposures: list[CollectiveExposure], previous_exit_ns: int | None,
                       ) -> tuple[dict[str, object], int | None]:
    """The step span's communication attributes (totals, then the wait entries and the work before
    each when they are known), and when the rank left the step's last collective (``None``: unknown)."""
    attributes = _communication_attributes(exposures)
    waits = wait_entries(record, exposures, c.MAX_COMM_ENTRIES, previous_exit_ns)
    if waits is None:
        return attributes, None
    attributes[c.ATTR_COMM_ENTRIES] = waits.entries
    attributes[c.ATTR_COMM_WORK] = waits.work
    return attributes, waits.last_exit_ns


def phase_communication(phase: PhaseTiming, exposures: list[CollectiveExposure]) -> dict[str, object]:
    """A phase call's exposed-communication attributes (empty: no collective started in it)."""
    inside = [e for e in exposures if e.phase is phase]
    if not inside:
        return {}
    optional = {
        c.ATTR_PHASE_COMM_EXPOSED_CPU: _seconds(total([e.exposed_ns for e in inside])),
        c.ATTR_PHASE_COMM_EXPOSED_GPU: _seconds(total([e.exposed_gpu_ns for e in inside])),
    }
    return {key: value for key, value in optional.items() if value is not None}


def _totals(
    members: list[CollectiveExposure], calls: str, nbytes: str, cpu: str, gpu: str, exposed_cpu: str,
    exposed_gpu: str,
) -> dict[str, object]:
    """Calls, bytes, total and exposed time of some collectives; unknown sums are left out."""
    timings = [m.timing for m in members]
    values: dict[str, object] = {calls: len(members), nbytes: sum([t.nbytes for t in timings])}
    for key, parts in ((cpu, [m.duration_ns for m in members]), (gpu, [t.gpu_duration_ns for t in timings]),
                       (exposed_cpu, [m.exposed_ns for m in members]),
                       (exposed_gpu, [m.exposed_gpu_ns for m in members])):
        if None not in parts:  # an unknown sum is left out
            values[key] = sum(parts) * _NS
    return values


def _communication_attributes(exposures: list[CollectiveExposure]) -> dict[str, object]:
    return _totals(exposures, c.ATTR_COMM_CALLS, c.ATTR_COMM_BYTES, c.ATTR_COMM_CPU, c.ATTR_COMM_GPU,
                   c.ATTR_COMM_EXPOSED_CPU, c.ATTR_COMM_EXPOSED_GPU)


def _seconds(value_ns: int | None) -> float | None:
    return None if value_ns is None else value_ns * _NS
