"""Metrics made outside the SDK's instruments join what a metric reader collects.

The step histograms are aggregated by hand (``emit/histogram_accumulator.py``, for the CPU) but must
leave through the SDK's reader like every other metric: the periodic reader's OTLP exporter (its
endpoint, headers, TLS, compression, retries and temporality preference) and the in-memory reader
the tests read. The Python SDK has no public hook for that (no ``MetricProducer``, as of 1.45), so
:func:`add_to_collection` wraps the collect callback the meter provider handed the reader: each
collection returns the SDK's ``MetricsData`` with our metrics added to our instrumentation scope.

It reads two private SDK attributes, both checked by ``tests/emit/test_histogram_accumulator.py``
(which compares our points with the SDK instrument's, through a real reader, under both
temporalities): ``MetricReader._collect`` (the callback the provider set; it is put back through
the reader's ``_set_collect_callback``) and ``MetricReader._instrument_class_temporality`` (the
reader's temporality per instrument class, which the reader resolves from its own or its
exporter's preference). If a future SDK drops them, :func:`add_to_collection` raises at start
(the emitter then reports metrics off) rather than exporting without the histograms.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

_log = logging.getLogger(__name__)


def histogram_temporality(reader: MetricReader) -> AggregationTemporality:
    """The temporality ``reader`` collects synchronous histograms with (cumulative unless it, or its
    exporter, prefers delta: ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``)."""
    by_class = getattr(reader, "_instrument_class_temporality", None)
    if not isinstance(by_class, dict):
        raise RuntimeError("this opentelemetry-sdk's MetricReader has no _instrument_class_temporality")
    for instrument_class, temporality in by_class.items():
        if isinstance(instrument_class, type) and issubclass(instrument_class, SdkHistogram):
            return AggregationTemporality(temporality)
    raise RuntimeError("this opentelemetry-sdk's MetricReader names no histogram temporality")


def add_to_collection(
    reader: MetricReader, produce: Callable[[int], Sequence[Metric]], resource: Resource,
    scope: InstrumentationScope,
) -> None:
    """Make each collection of ``reader`` (already registered on its meter provider) include
    ``produce(now_ns)``'s metrics, in ``scope``. A failing ``produce`` is logged and that collection
    goes out without them (a reader thread that raised would stop exporting altogether)."""
    inner = getattr(reader, "_collect", None)
    if not callable(inner):
        raise RuntimeError("the metric reader is not registered on a meter provider (no _collect callback)")

    def collect(metric_reader: MetricReader, timeout_millis: float = 10_000) -> MetricsData | None:
        data = inner(metric_reader, timeout_millis=timeout_millis)
        try:
            ours = produce(time.time_ns())
        except Exception:  # a bug of ours must not stop the SDK's own metrics
            _log.warning("traceml: the step histograms could not be collected", exc_info=True)
            return data
        return merged(data, ours, resource, scope)

    reader._set_collect_callback(collect)


def merged(
    data: MetricsData | None, metrics: Sequence[Metric], resource: Resource, scope: InstrumentationScope,
) -> MetricsData | None:
    """``data`` with ``metrics`` first in ``scope``'s list (a new scope, or new data, when absent)."""
    if not metrics:
        return data
    ours = ScopeMetrics(scope=scope, metrics=list(metrics), schema_url=scope.schema_url or "")
    if data is None or not data.resource_metrics:
        return MetricsData(resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[ours], schema_url=resource.schema_url)])
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for index, scope_metrics in enumerate(scopes):
        if scope_metrics.scope == scope:
            scopes[index] = dataclasses.replace(scope_metrics, metrics=[*metrics, *scope_metrics.metrics])
            break
    else:
        scopes.append(ours)
    return MetricsData(resource_metrics=[dataclasses.replace(first, scope_metrics=scopes), *rest])
