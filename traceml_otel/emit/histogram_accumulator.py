"""The step histograms, aggregated by hand and handed to the SDK as its own data-model objects.

Why by hand: the SDK's ``Histogram.record`` costs 10-20 µs per measurement (it cleans and hashes
the attributes, builds a ``Measurement``, takes two locks, runs the exemplar filter and the
reservoir); with five measurements a step (the step, three phases, the input wait) the metrics were
the emitter's largest stage, 90-130 µs of CPU per step (``benchmarks/emitter_cost.py --otlp``), and
the SDK has no batch API. Here a measurement is a dict lookup, a ``bisect`` and a few additions
(about 0.5 µs). What leaves the process does not change: :meth:`HistogramGroup.collect` returns the
SDK's ``Metric``/``Histogram``/``HistogramDataPoint``/``Exemplar`` objects, which
``emit/metric_merge.py`` adds to the reader's collection, and the SDK's OTLP exporter encodes and
sends them (retries, configuration) as before.

What it reproduces of the SDK (``_ExplicitBucketHistogramAggregation`` with the default exemplar
reservoir, ``AlignedHistogramBucketExemplarReservoir``, and the filter ``OTEL_METRICS_EXEMPLAR_FILTER``
names, ``trace_based`` by default); ``tests/emit/test_histogram_accumulator.py`` feeds the same
measurements through the SDK's instrument and through this and compares the points:

- buckets by ``bisect_left`` (a value on a boundary counts in the bucket it closes), count, sum, min
  and max; non-finite and negative values are dropped (the SDK logs each one; here they are counted
  in :attr:`HistogramAccumulator.rejected`, logged once, and the group's total,
  :attr:`HistogramGroup.rejected`, reaches ``rank-R.export.json`` as ``metric_values_rejected``, so
  the launcher's account and the analyzer report them);
- cumulative: totals since the series' first measurement (its start time), each interval's sum
  added to the total as the SDK adds it (so the floats agree to the bit); an idle series still
  reports. Delta: the interval's values, a series with no measurement has no point, and the start is
  the previous collection (the first measurement before any);
- exemplars: per bucket, the latest measurement of the interval offered by the filter (with a
  sampled step: trace and span id, value, time, the attributes not on the point), reset at each
  collection;
- at most :data:`CARDINALITY_LIMIT` series per metric (per collection under delta); further ones go
  to one ``otel.metric.overflow=true`` series.

Not thread-safe by itself: the owner records and collects under :attr:`HistogramGroup.lock`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import repeat
from operator import add
from typing import Any

from opentelemetry.sdk.environment_variables import OTEL_METRICS_EXEMPLAR_FILTER
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, HistogramDataPoint, Metric

_log = logging.getLogger(__name__)

CARDINALITY_LIMIT = 2000
"""Series per metric before the overflow series (the SDK's default cardinality limit)."""
OVERFLOW_ATTRIBUTES: Mapping[str, Any] = {"otel.metric.overflow": True}

_OVERFLOW_KEY = object()
_DELTA = AggregationTemporality.DELTA

Attributes = Mapping[str, Any]
_ExemplarSlot = tuple[float, int, "int | None", "int | None", "Attributes | None"]
"""value, time, trace id, span id, the measurement's attributes (``None``: the point's)."""


def exemplar_filter() -> str:
    """``trace_based``, ``always_on`` or ``always_off``, from ``OTEL_METRICS_EXEMPLAR_FILTER`` as the
    SDK reads it (the SDK refuses other values when the meter provider starts)."""
    value = os.environ.get(OTEL_METRICS_EXEMPLAR_FILTER, "trace_based")
    return value if value in ("always_on", "always_off") else "trace_based"


@dataclass(slots=True)
class _Series:
    """One (metric, attributes) series: this interval's values, and the totals under cumulative."""

    attributes: Attributes
    start_ns: int
    buckets: int
    counts: list[int] = field(init=False)
    sum: float = field(init=False)
    min: float = field(init=False)
    max: float = field(init=False)
    exemplars: list[_ExemplarSlot | None] = field(init=False)
    total_counts: list[int] = field(init=False)
    total_sum: float = 0
    total_min: float = math.inf
    total_max: float = -math.inf

    def __post_init__(self) -> None:
        self.total_counts = [0] * self.buckets
        self.reset()

    def reset(self) -> None:
        """A new interval."""
        self.counts = [0] * self.buckets
        self.sum = 0
        self.min = math.inf
        self.max = -math.inf
        self.exemplars = [None] * self.buckets


class HistogramAccumulator:
    """One histogram metric: its series by the caller's key (``attributes_of(key)`` names a new one)."""

    def __init__(
        self, name: str, unit: str, description: str, boundaries: Sequence[float],
        attributes_of: Callable[[Any], Attributes], temporality: AggregationTemporality,
        exemplars: str = "trace_based",
    ) -> None:
        self.name, self.unit, self.description = name, unit, description
        self._boundaries = tuple(float(b) for b in boundaries)
        if any(not math.isfinite(b) for b in self._boundaries) or any(
                a >= b for a, b in zip(self._boundaries, self._boundaries[1:], strict=False)):
            raise ValueError(f"{name}: boundaries must be finite and strictly increasing")
        self._buckets = len(self._boundaries) + 1
        self._attributes_of = attributes_of
        self._temporality = temporality
        self._traced = exemplars != "always_off"
        self._untraced = exemplars == "always_on"
        self._series: dict[Hashable, _Series] = {}
        self._last_collect_ns: int | None = None
        self._started = False
        self.rejected = 0
        """Measurements dropped as not finite or negative (the SDK's histogram drops them too)."""

    def record(self, key: Hashable, value: float, time_ns: int,
               trace_id: int | None = None, span_id: int | None = None) -> None:
        """Add ``value`` to the series ``key``; ``trace_id``/``span_id`` (a sampled step's) make it an
        exemplar candidate. ``time_ns``: the measurement's Unix time."""
        if not 0.0 <= value < math.inf:
            self._reject(value)
            return
        series = self._series.get(key)
        if series is None:
            series = self._new_series(key, time_ns)
        index = bisect_left(self._boundaries, value)
        series.counts[index] += 1
        series.sum += value
        if value < series.min:
            series.min = value
        if value > series.max:
            series.max = value
        if (self._traced if trace_id is not None else self._untraced):
            # the measurement's attributes: the point's, but for the overflow series
            measured = self._attributes_of(key) if series.attributes is OVERFLOW_ATTRIBUTES else None
            series.exemplars[index] = (value, time_ns, trace_id, span_id, measured)

    def record_many(self, key: Hashable, values: Sequence[float], time_ns: int,
                    ids: Sequence[tuple[int, int] | None]) -> None:
        """:meth:`record` of each value in order, all at ``time_ns``, each with its sampled step's
        (trace id, span id) or ``None``: the same series afterwards, a column at a time (the buckets
        by ``map``, the sum by ``reduce`` in order, so it is the same float)."""
        if not values:
            return
        total = sum(values)  # NaN when any value is: then min and max are not to be trusted
        if not (total == total and min(values) >= 0.0 and max(values) < math.inf):
            for value, pair in zip(values, ids, strict=True):
                self.record(key, value, time_ns, *(pair or (None, None)))
            return
        series = self._series.get(key)
        if series is None:
            series = self._new_series(key, time_ns)
        indices = list(map(bisect_left, repeat(self._boundaries), values))
        counts = series.counts
        for index in indices:
            counts[index] += 1
        series.sum = reduce(add, values, series.sum)
        low, high = min(values), max(values)
        if low < series.min:
            series.min = low
        if high > series.max:
            series.max = high
        untraced = ids.count(None)
        if (untraced == 0 and self._traced) or (untraced == len(ids) and self._untraced):
            last = dict(zip(indices, range(len(values)), strict=True))  # each bucket's latest one
        elif untraced == len(ids) or not self._traced:  # (always_on is traced too)
            return
        else:
            last = {index: position for position, (index, pair) in enumerate(zip(indices, ids, strict=True))
                    if (self._traced if pair is not None else self._untraced)}
        measured = self._attributes_of(key) if series.attributes is OVERFLOW_ATTRIBUTES else None
        exemplars = series.exemplars
        for index, position in last.items():
            pair = ids[position]
            exemplars[index] = (values[position], time_ns, *(pair or (None, None)), measured)

    def _new_series(self, key: Hashable, time_ns: int) -> _Series:
        self._started = True
        # delta: a series starts at the previous collection; cumulative: at its first measurement
        start_ns = self._last_collect_ns if self._last_collect_ns is not None else time_ns
        if len(self._series) >= CARDINALITY_LIMIT:
            overflow = self._series.get(_OVERFLOW_KEY)
            if overflow is None:
                overflow = self._series[_OVERFLOW_KEY] = _Series(OVERFLOW_ATTRIBUTES, start_ns, self._buckets)
            return overflow
        series = self._series[key] = _Series(self._attributes_of(key), start_ns, self._buckets)
        return series

    def _reject(self, value: float) -> None:
        self.rejected += 1
        if self.rejected == 1:
            _log.warning("%s: dropped a measurement of %r (not finite or negative); later ones are only "
                         "counted", self.name, value)

    def collect(self, now_ns: int) -> Metric | None:
        """The metric's points at ``now_ns`` (``None`` when it has none), and a new interval."""
        points = [point for series in self._series.values()
                  if (point := self._point(series, now_ns)) is not None]
        if self._temporality is _DELTA:
            self._series = {}
            if self._started:
                self._last_collect_ns = now_ns
        if not points:
            return None
        return Metric(name=self.name, description=self.description, unit=self.unit,
                      data=Histogram(data_points=points, aggregation_temporality=self._temporality))

    def _point(self, series: _Series, now_ns: int) -> HistogramDataPoint | None:
        exemplars = _exemplars(series)
        if self._temporality is _DELTA:
            count = sum(series.counts)
            if not count:
                return None
            return HistogramDataPoint(
                attributes=series.attributes, start_time_unix_nano=series.start_ns, time_unix_nano=now_ns,
                count=count, sum=series.sum, bucket_counts=tuple(series.counts),
                explicit_bounds=self._boundaries, min=series.min, max=series.max, exemplars=exemplars)
        series.total_counts = [a + b for a, b in zip(series.counts, series.total_counts, strict=True)]
        series.total_min = min(series.min, series.total_min)
        series.total_max = max(series.max, series.total_max)
        series.total_sum = series.sum + series.total_sum
        series.reset()
        return HistogramDataPoint(
            attributes=series.attributes, start_time_unix_nano=series.start_ns, time_unix_nano=now_ns,
            count=sum(series.total_counts), sum=series.total_sum, bucket_counts=tuple(series.total_counts),
            explicit_bounds=self._boundaries, min=series.total_min, max=series.total_max, exemplars=exemplars)


def _exemplars(series: _Series) -> list[Exemplar]:
    """The interval's exemplars in bucket order, with the attributes the point does not carry."""
    out = []
    for slot in series.exemplars:
        if slot is not None:
            value, time_ns, trace_id, span_id, measured = slot
            measured = series.attributes if measured is None else measured
            filtered = {k: v for k, v in measured.items() if k not in series.attributes} if measured else None
            out.append(Exemplar(filtered, value, time_ns, span_id, trace_id))
    return out


class HistogramGroup:
    """The histograms one owner records into and collects together, under one lock."""

    def __init__(self, temporality: AggregationTemporality, exemplars: str | None = None) -> None:
        self.temporality = temporality
        self._exemplars = exemplar_filter() if exemplars is None else exemplars
        self.lock = threading.Lock()
        self.histograms: list[HistogramAccumulator] = []

    def histogram(
        self, name: str, unit: str, description: str, boundaries: Sequence[float],
        attributes_of: Callable[[Any], Attributes],
    ) -> HistogramAccumulator:
        """A new histogram in the group."""
        histogram = HistogramAccumulator(name, unit, description, boundaries, attributes_of,
                                         self.temporality, self._exemplars)
        self.histograms.append(histogram)
        return histogram

    @property
    def rejected(self) -> int:
        """Measurements every histogram of the group dropped so far (not finite or negative)."""
        with self.lock:
            return sum(histogram.rejected for histogram in self.histograms)

    def collect(self, now_ns: int) -> list[Metric]:
        """Every histogram's metric that has points at ``now_ns``, in creation order."""
        with self.lock:
            metrics = [histogram.collect(now_ns) for histogram in self.histograms]
        return [metric for metric in metrics if metric is not None]
