"""The spans and attributes the analyzer reads: which span names it knows and which attributes
the sources decode.

Every source (files, Tempo, Jaeger) decodes only :data:`WANTED_ATTRIBUTES` of a span and hands them
to :meth:`~traceml_otel.analyze.assembler.StepAssembler.add_span`, which files the span under
:data:`SPAN_INDEX` (or :func:`classify_by_attributes` when a source returns no span name). The
names come from ``contract.py``, as docs/telemetry.md documents them.
"""

from __future__ import annotations

from collections.abc import Mapping

from traceml_otel import contract as c
from traceml_otel.analyze.run_model import PHASE_INDEX
from traceml_otel.wire.step_schema import H2D_BEFORE_STEP

STEP_SPAN = -1
"""Pseudo phase index of the ``traceml.step`` span."""
COLLECTIVE_SPAN = -2
"""Pseudo index of ``traceml.collective`` spans: known, but their totals are read from the step span."""

SPAN_INDEX: dict[str, int] = {c.SPAN_STEP: STEP_SPAN, c.SPAN_COLLECTIVE: COLLECTIVE_SPAN} | {
    name: PHASE_INDEX[phase] for name, phase in c.SPAN_NAME_TO_PHASE.items()
}

LOADER_ATTRIBUTES = (
    c.ATTR_LOADER_NUM_WORKERS,
    c.ATTR_LOADER_PIN_MEMORY,
    c.ATTR_LOADER_PERSISTENT_WORKERS,
    c.ATTR_LOADER_PREFETCH_FACTOR,
    c.ATTR_LOADER_BATCH_SIZE,
    c.ATTR_LOADER_DATASET,
)
"""DataLoader settings, in :class:`~traceml_otel.analyze.run_model.RankHost` field order."""

WANTED_ATTRIBUTES = frozenset(
    {
        c.ATTR_RUN_ID,
        c.ATTR_COMM_ENTRIES,
        c.ATTR_COMM_WORK,
        c.ATTR_STEP,
        c.ATTR_RANK,
        c.ATTR_WORLD_SIZE,
        c.ATTR_PARALLELISM,
        c.ATTR_STEP_CPU_DURATION,
        c.ATTR_STEP_GPU_DURATION,
        c.ATTR_INPUT_WAIT_CPU,
        c.ATTR_INPUT_WAIT_GPU,
        *(str(f.attribute) for f in H2D_BEFORE_STEP),
        c.ATTR_OPTIMIZER_STEPS,
        c.ATTR_OPTIMIZER_SKIPPED,
        c.ATTR_MEM_PEAK_ALLOCATED,
        c.ATTR_MEM_PEAK_RESERVED,
        c.ATTR_MEM_TOTAL,
        c.ATTR_EXCEPTION_TYPE,
        c.ATTR_PHASE_NAME,
        c.ATTR_PHASE_CPU_DURATION,
        c.ATTR_PHASE_GPU_DURATION,
        c.ATTR_STEP_SAMPLES,
        c.ATTR_STEP_TOKENS,
        *LOADER_ATTRIBUTES,
        c.ATTR_HOST_CPUS,
        c.ATTR_COMM_CALLS,
        c.ATTR_COMM_BYTES,
        c.ATTR_COMM_CPU,
        c.ATTR_COMM_GPU,
        c.ATTR_COMM_EXPOSED_CPU,
        c.ATTR_COMM_EXPOSED_GPU,
        c.ATTR_PHASE_COMM_EXPOSED_CPU,
        c.ATTR_PHASE_COMM_EXPOSED_GPU,
        c.ATTR_COLLECTIVE_KIND,
        c.ATTR_STEP_SOURCE,
        c.ATTR_BETWEEN_STEPS_CPU,
        c.ATTR_SAMPLING_THRESHOLD,
    }
)
"""The attributes the analyzer reads; sources decode only these."""


def classify_by_attributes(attrs: Mapping[str, object]) -> int | None:
    """The span's :data:`SPAN_INDEX` value (a phase index, :data:`STEP_SPAN` or
    :data:`COLLECTIVE_SPAN`) for sources that return no span name (e.g. a TraceQL ``select``), from
    the attributes only that kind carries; None for a span that is none of ours."""
    phase = attrs.get(c.ATTR_PHASE_NAME)
    if isinstance(phase, str) and phase in PHASE_INDEX:
        return PHASE_INDEX[phase]
    if c.ATTR_STEP_CPU_DURATION in attrs or c.ATTR_STEP_GPU_DURATION in attrs:
        return STEP_SPAN
    if c.ATTR_COLLECTIVE_KIND in attrs:
        return COLLECTIVE_SPAN
    return None
