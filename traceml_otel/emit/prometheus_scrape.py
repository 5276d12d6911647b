"""The direct Prometheus scrape path: the step series served by ``prometheus-client`` from the
emitter (no collector needed), aggregated by hand and read at each scrape.

Same metric set as the OTLP path (emit/step_metrics.py), read from the shared
:class:`~traceml_otel.emit.live_state.LiveState`. A duration that is not finite or negative is
dropped and counted (:attr:`PrometheusStepMetrics.rejected`), as the OTLP histograms drop it:
``prometheus-client`` would take it, and one NaN turns a series' ``_sum`` into NaN for good.

Why by hand (as the OTLP histograms, emit/histogram_accumulator.py): with ``prometheus-client``'s
``Histogram``/``Summary``/``Counter``, each measurement looked its labelled child up
(``.labels(**labels)`` hashes and checks the label values) and took a lock per value: a median 39
µs of emitter CPU per step (62 with DDP collectives) in ``benchmarks/metrics_cost.py --only scrape
[--ddp]``, now 10 (14), what the OTLP path costs (benchmarks/JOURNAL.md). Here a call takes one lock
and a measurement is a dict lookup, a ``bisect`` and a few additions; at each scrape a collector
yields ``prometheus-client``'s own metric families (``HistogramMetricFamily``,
``SummaryMetricFamily``, ``CounterMetricFamily``), which its exposition code formats as before. What
is served does not change (``tests/emit/test_prometheus_scrape_parity.py`` feeds the same values to
``prometheus-client``'s instruments and to this and compares both formats): the same families in
the same order, series in first-measurement order and only from their first measurement, float
totals added in the same order, per histogram bucket the latest exemplar (served in OpenMetrics),
no ``_created`` series, and a negative counter increment refused with the same ``ValueError``.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.live_state import CollectiveSample, IntervalPeak, LiveState
from traceml_otel.emit.run_end import ScrapeLog
from traceml_otel.wire.metric_labels import (
    EXIT_REASON_LABEL,
    EXIT_STATUS_LABEL,
    JOB_LABEL,
    KIND_LABEL,
    PHASE_LABEL,
    RANK_LABEL,
    RUN_LABEL,
    SOURCE_LABEL,
)


@dataclass(frozen=True, slots=True)
class PrometheusEndpoint:
    """Where the direct scrape endpoint listens."""

    port: int
    address: str = "127.0.0.1"


_Key = tuple[str, ...]
"""A series' label values after the rank's (the phase; the collective's source and kind)."""


class _Summaries:
    """One summary family without quantiles (``_count`` and ``_sum``) by series."""

    def __init__(self, name: str, documentation: str, label_names: list[str]) -> None:
        self.name, self.documentation, self.label_names = name, documentation, label_names
        self.series: dict[_Key, list[float]] = {}

    def observe(self, key: _Key, value: float) -> None:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [0.0, 0.0]
        series[0] += 1.0
        series[1] += value

    def family(self, rank_values: list[str]) -> object:
        from prometheus_client.core import SummaryMetricFamily

        family = SummaryMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key, (count, total) in self.series.items():
            family.add_metric([*rank_values, *key], count, total)
        return family


class _Counters:
    """One counter family by series (``_total``)."""

    def __init__(self, name: str, documentation: str, label_names: list[str]) -> None:
        self.name, self.documentation, self.label_names = name, documentation, label_names
        self.series: dict[_Key, float] = {}

    def inc(self, key: _Key, amount: float) -> None:
        series = self.series
        if amount < 0:  # prometheus-client's Counter made the series, then refused it with this error
            series.setdefault(key, 0.0)
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        series[key] = series.get(key, 0.0) + amount

    def family(self, rank_values: list[str]) -> object:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.label_names)
        for key, value in self.series.items():
            family.add_metric([*rank_values, *key], value)
        return family


class _Histogram:
    """The rank's step-duration histogram: bucket counts, sum, and per bucket the latest exemplar
    (trace id, span id, value, Unix time), kept across scrapes as ``prometheus-client`` keeps it.
    The ids are kept as integers and written in hex at the scrape (not at every step)."""

    def __init__(self, name: str, documentation: str, label_names: list[str],
                 boundaries: tuple[float, ...]) -> None:
        from prometheus_client.utils import floatToGoString

        self.name, self.documentation, self.label_names = name, documentation, label_names
        self._boundaries = tuple(float(b) for b in boundaries)
        self._le = [floatToGoString(b) for b in (*self._boundaries, math.inf)]
        self.counts: list[float] | None = None
        """Per bucket, not cumulated; None before the first measurement."""
        self.sum = 0.0
        self.exemplars: list[tuple[int, int, float, float] | None] = [None] * len(self._le)

    def observe(self, value: float, exemplar_ids: tuple[int, int] | None) -> None:
        """Add a finite, non-negative ``value`` (the bucket it falls on the boundary of counts it)."""
        counts = self.counts
        if counts is None:
            counts = self.counts = [0.0] * len(self._le)
        self.sum += value
        index = bisect_left(self._boundaries, value)
        counts[index] += 1.0
        if exemplar_ids is not None:
            self.exemplars[index] = (exemplar_ids[0], exemplar_ids[1], value, time.time())

    def family(self, rank_values: list[str]) -> object:
        from prometheus_client.core import Exemplar, HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        if self.counts is not None:
            buckets: list[Any] = []
            cumulated = 0.0
            for le, count, exemplar in zip(self._le, self.counts, self.exemplars, strict=True):
                cumulated += count
                if exemplar is None:
                    buckets.append((le, cumulated))
                else:
                    trace_id, span_id, value, at = exemplar
                    ids = {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}
                    buckets.append((le, cumulated, Exemplar(ids, value, at)))
            family.add_metric(rank_values, buckets, self.sum)
        return family


class PrometheusStepMetrics:
    """The same series for direct Prometheus scraping (no collector needed).

    Served in OpenMetrics (with exemplars) to scrapers that ask for it, else in the text
    format. Series appear with their first measurement: nothing is exposed as 0 before it
    was measured, and CUDA memory never on a CPU run. The dropped-spans counter, the
    end marker and the info series are there from the first scrape. Recording and the
    scrape thread's collection take one lock.
    """

    def __init__(self, endpoint: PrometheusEndpoint | None, state: LiveState) -> None:
        """``endpoint`` None builds the registry without serving it (the scale benchmark reads it)."""
        from prometheus_client import CollectorRegistry

        self.registry = registry = CollectorRegistry()
        labels = [JOB_LABEL, RUN_LABEL, RANK_LABEL]
        self._labels = {JOB_LABEL: state.labels.job_label, RUN_LABEL: state.labels.run_id,
                        RANK_LABEL: str(state.labels.rank)}
        self._state = state
        self._allocated = IntervalPeak()
        self._reserved = IntervalPeak()
        self._scrapes = 0
        self._scraped = threading.Condition()
        self._lock = threading.Lock()
        self.rejected = 0
        """Durations dropped as not finite or negative (the OTLP histograms drop the same ones)."""
        self.scrapes = ScrapeLog()
        self._step = _Histogram("traceml_step_duration_seconds", "Traced step time", labels,
                                c.DURATION_BUCKETS_S)
        # c.SUM_ONLY_HISTOGRAMS: only _sum and _count are read, so a summary without quantiles
        # (prometheus-client's needs two buckets for a histogram; OTLP sends one +Inf bucket).
        self._phase = _Summaries("traceml_phase_duration_seconds", "Phase call duration",
                                 [*labels, PHASE_LABEL])
        self._wait = _Summaries("traceml_step_input_wait_seconds", "Input wait before each step", labels)
        collective_labels = [*labels, SOURCE_LABEL, KIND_LABEL]
        self._collective = _Summaries("traceml_collective_duration_seconds", "Collective time per step",
                                      collective_labels)
        self._collective_exposed = _Summaries("traceml_collective_exposed_seconds",
                                              "Exposed collective time per step", collective_labels)
        self._collective_calls = _Counters("traceml_collective_calls", "Collective calls", collective_labels)
        self._collective_bytes = _Counters("traceml_collective_bytes", "Collective payload bytes",
                                           collective_labels)
        self._steps = _Counters("traceml_steps", "Completed steps", labels)
        self._samples = _Counters("traceml_samples", "Samples processed", labels)
        self._tokens = _Counters("traceml_tokens", "Tokens processed", labels)
        self._families: tuple[_Histogram | _Summaries | _Counters, ...] = (  # the order they are served in
            self._step, self._phase, self._wait, self._collective, self._collective_exposed,
            self._collective_calls, self._collective_bytes, self._steps, self._samples, self._tokens)
        registry.register(_StepCollector(self))
        registry.register(_LiveCollector(self))
        self.server = None
        if endpoint is not None:
            self.server = serve_registry(registry, endpoint, self.scrapes)

    def record(
        self, step_s: float, phases: list[tuple[str, float]], wait_s: float | None,
        memory: tuple[int, int] | None, exemplar_ids: tuple[int, int] | None = None,
    ) -> None:
        """One step: its duration (``exemplar_ids``: the step span's trace and span id, served as the
        exemplar's ``trace_id`` and ``span_id`` in hex), phases, input wait and CUDA peaks."""
        with self._lock:
            if self._valid(step_s):
                self._step.observe(step_s, exemplar_ids)
            for phase, seconds in phases:
                if self._valid(seconds):
                    self._phase.observe((str(phase),), seconds)
            if wait_s is not None and self._valid(wait_s):
                self._wait.observe((), wait_s)
            self._steps.inc((), 1)
        if memory is not None:
            self._allocated.update(memory[0])
            self._reserved.update(memory[1])

    def _valid(self, seconds: float) -> bool:
        """Whether a duration can be observed; one that is not finite or negative is counted instead."""
        if 0.0 <= seconds < math.inf:
            return True
        self.rejected += 1
        return False

    def record_work(self, samples: int | None, tokens: int | None) -> None:
        """Count a step's samples and tokens (the series appear with the first known count)."""
        with self._lock:
            if samples is not None:
                self._samples.inc((), samples)
            if tokens is not None:
                self._tokens.inc((), tokens)

    def record_collectives(self, collectives: list[CollectiveSample]) -> None:
        """One step's collectives, per (source, kind): total and exposed time when measured, calls, bytes."""
        with self._lock:
            for one in collectives:
                key = (str(one.source), str(one.kind))
                if one.seconds is not None and self._valid(one.seconds):
                    self._collective.observe(key, one.seconds)
                if one.exposed is not None and self._valid(one.exposed):
                    self._collective_exposed.observe(key, one.exposed)
                self._collective_calls.inc(key, one.calls)
                self._collective_bytes.inc(key, one.nbytes)

    def collect_steps(self) -> list[object]:
        """The recorded families, read under the lock (every family, a series only once measured)."""
        rank_values = list(self._labels.values())
        with self._lock:
            return [family.family(rank_values) for family in self._families]

    def collect_live(self) -> Iterator[object]:
        """The families read at scrape time (called by the registry on each scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state, keys, values = self._state, list(self._labels), list(self._labels.values())

        def gauge(name: str, documentation: str, value: float | int | None, unit: str = "") -> None:
            if value is not None:
                family = GaugeMetricFamily(name, documentation, labels=keys, unit=unit)
                family.add_metric(values, value)
                families.append(family)

        families: list[object] = []
        dropped = CounterMetricFamily("traceml_export_dropped_spans", "Spans OTLP export could not deliver",
                                      labels=keys)
        dropped.add_metric(values, state.dropped_spans())
        families.append(dropped)
        gauge("traceml_input_wait_duration_seconds", "Input wait of the last step", state.last_wait_s)
        gauge("traceml_cuda_memory_peak_allocated_bytes", "CUDA peak allocated, max since the last scrape",
              self._allocated.take())
        gauge("traceml_cuda_memory_peak_reserved_bytes", "CUDA peak reserved, max since the last scrape",
              self._reserved.take())
        gauge("traceml_step_last_timestamp_seconds", "Unix time at which the last step ended",
              state.last_step_end_s)
        exit_status, ended, first = state.end_for_scrape()
        gauge("traceml_run_ended", "1 once this rank ended and said so, else 0", ended)
        gauge("traceml_world_size", "Ranks in the job", state.labels.world_size or None)
        seconds, phase = state.stalled()
        stalled = GaugeMetricFamily("traceml_progress_stalled_seconds",
                                    "Seconds without progress once a hang was seen (0 otherwise)",
                                    labels=[*keys, PHASE_LABEL])
        stalled.add_metric([*values, phase], seconds)
        families.append(stalled)
        families += state.time.prometheus_families(keys, values)
        if exit_status is not None:
            end = GaugeMetricFamily("traceml_run_exit", "Always 1 once the rank ended; labels say how",
                                    labels=[*keys, EXIT_STATUS_LABEL, EXIT_REASON_LABEL])
            end.add_metric([*values, *exit_status], 1)
            families.append(end)
        if first is not None:
            failure = GaugeMetricFamily(
                "traceml_run_first_failure", "Always 1 after the end once the launcher saw a rank fail first",
                labels=[*keys, "traceml_first_failure_rank", "traceml_first_failure_reason"])
            failure.add_metric([*values, str(first[0]), first[1]], 1)
            families.append(failure)
        info_labels = state.info_labels()
        info = GaugeMetricFamily("traceml_rank_info", "Always 1; labels describe the rank",
                                 labels=[*keys, *info_labels])
        info.add_metric([*values, *info_labels.values()], 1)
        families.append(info)
        with self._scraped:
            self._scrapes += 1
            self._scraped.notify_all()
        return iter(families)

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Block until one more scrape happened (or ``timeout_s``); True if it did."""
        with self._scraped:
            seen = self._scrapes
            return self._scraped.wait_for(lambda: self._scrapes > seen, timeout=max(0.0, timeout_s))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _StepCollector:
    """Adapter for the recorded families: prometheus_client calls ``collect()`` on every scrape."""

    def __init__(self, owner: PrometheusStepMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[object]:
        return iter(self._owner.collect_steps())

    def describe(self) -> list[object]:
        """The families (empty at registration), whose names let ``?name[]=`` select them as it
        selected prometheus-client's own instruments."""
        return self._owner.collect_steps()


class _LiveCollector:
    """Adapter: prometheus_client calls ``collect()`` on every scrape."""

    def __init__(self, owner: PrometheusStepMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[object]:
        return self._owner.collect_live()

    def describe(self) -> list[object]:
        return []  # no up-front description: collect() must not run (or count) at registration


POST_ROUTES: dict[str, Callable[[str], tuple[str, str]]] = {}
"""POST handlers on the scrape endpoint, by path (the emitter's ``/capture``, ``emit/capture_events.py``):
the query string in, an HTTP status line and a JSON body out. The request body is read (at most
:data:`MAX_POST_BYTES`) and ignored, so an Alertmanager webhook can call it."""
MAX_POST_BYTES = 1 << 20


def _post(route: Callable[[str], tuple[str, str]], environ: dict[str, Any], start_response: Any,
          ) -> list[bytes]:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if not 0 <= length <= MAX_POST_BYTES:
        start_response("413 Payload Too Large", [("Content-Type", "application/json")])
        return [b'{"error": "body over 1 MiB"}']
    stream = environ.get("wsgi.input")
    while length > 0 and stream is not None:
        chunk = stream.read(min(length, 65536))
        if not chunk:
            break
        length -= len(chunk)
    status, body = route(str(environ.get("QUERY_STRING", ""))[:512])
    start_response(status, [("Content-Type", "application/json")])
    return [body.encode()]


def serve_registry(registry: object, endpoint: PrometheusEndpoint, scrapes: ScrapeLog) -> Any:
    """Serve ``registry`` with prometheus-client's WSGI app on a daemon thread, noting each scrape's
    address in ``scrapes`` (how often each scraper comes decides the linger at the end)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

    app = make_wsgi_app(registry)

    def noting(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") == "POST":
            route = POST_ROUTES.get(str(environ.get("PATH_INFO", "")))
            if route is not None:
                return _post(route, environ, start_response)
        scrapes.scraped(str(environ.get("REMOTE_ADDR", "")))
        return app(environ, start_response)

    server_class = ThreadingWSGIServer
    if ":" in endpoint.address:
        server_class = type("ThreadingWSGIServer6", (ThreadingWSGIServer,),
                            {"address_family": socket.AF_INET6})
    server = make_server(endpoint.address, endpoint.port, noting, server_class, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="traceml-scrape").start()
    return server
