"""Feed OTLP JSON ``ResourceSpans`` into a step assembler (shared by file and Jaeger sources)."""

from __future__ import annotations

from collections.abc import Iterable

from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.otlp_decode import as_str, decode_attributes, scope_spans
from traceml_otel.analyze.span_schema import WANTED_ATTRIBUTES
from traceml_otel.contract import ATTR_RUN_ID

SERVICE_NAME = "service.name"
_RESOURCE_KEYS = frozenset({SERVICE_NAME, ATTR_RUN_ID})
MALFORMED = (KeyError, TypeError, AttributeError, ValueError, OverflowError, RecursionError)
"""What feeding a structurally broken or hostile document raises (``1e400`` where an integer
belongs raises ``OverflowError``; absurd nesting ``RecursionError``)."""


def feed_resource_spans(
    resources: Iterable[dict], assembler: StepAssembler, *, service: str | None = None
) -> int:
    """Fold every span of ``resources`` in; returns how many spans were looked at.

    Spans of another ``service.name`` than ``service`` (when given) are skipped whole. Malformed
    spans raise one of :data:`MALFORMED`.
    """
    seen = 0
    add_span = assembler.add_span
    wanted = WANTED_ATTRIBUTES
    for resource in resources:
        described = resource.get("resource") or {}
        resource_attrs = decode_attributes(described.get("attributes") or (), _RESOURCE_KEYS)
        if service is not None and resource_attrs.get(SERVICE_NAME) != service:
            continue
        default_run = as_str(resource_attrs.get(ATTR_RUN_ID)) or ""
        service_name = as_str(resource_attrs.get(SERVICE_NAME))
        if service_name:
            assembler.note_service(default_run, service_name)
        for spans in scope_spans(resource):
            seen += len(spans)
            for span in spans:
                add_span(
                    span.get("name"),
                    decode_attributes(span.get("attributes") or (), wanted),
                    span,
                    default_run,
                )
    return seen
