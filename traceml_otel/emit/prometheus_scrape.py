"""The direct Prometheus scrape path: the step series served by ``prometheus-client`` from the
emitter (no collector needed), with the families read live at each scrape.

Same metric set as the OTLP path (emit/step_metrics.py), read from the shared
:class:`~traceml_otel.emit.live_state.LiveState`. A duration that is not finite or negative is
dropped and counted (:attr:`PrometheusStepMetrics.rejected`), as the OTLP histograms drop it:
``prometheus-client`` would take it, and one NaN turns a series' ``_sum`` into NaN for good.
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from traceml_otel import contract as c
from traceml_otel.emit.live_state import CollectiveSample, IntervalPeak, LiveState
from traceml_otel.emit.run_end import ScrapeLog


@dataclass(frozen=True, slots=True)
class PrometheusEndpoint:
    """Where the direct scrape endpoint listens."""

    port: int
    address: str = "127.0.0.1"


class PrometheusStepMetrics:
    """The same series for direct Prometheus scraping (no collector needed).

    Served in OpenMetrics (with exemplars) to scrapers that ask for it, else in the text
    format. Series appear with their first measurement: nothing is exposed as 0 before it
    was measured, and CUDA memory never on a CPU run. The dropped-spans counter, the
    end marker and the info series are there from the first scrape.
    """

    def __init__(self, endpoint: PrometheusEndpoint | None, state: LiveState) -> None:
        """``endpoint`` None builds the registry without serving it (the scale benchmark reads it)."""
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

        # Nothing reads the OpenMetrics `_created` series (one per counter and histogram series):
        # they would add ~10 series per rank. The emitter is its own process, so this global is ours.
        prometheus_client.disable_created_metrics()
        self.registry = registry = CollectorRegistry()
        labels = ["traceml_job", "traceml_run_id", "traceml_rank"]
        self._labels = {"traceml_job": state.labels.job_label, "traceml_run_id": state.labels.run_id,
                        "traceml_rank": str(state.labels.rank)}
        self._state = state
        self._allocated = IntervalPeak()
        self._reserved = IntervalPeak()
        self._scrapes = 0
        self._scraped = threading.Condition()
        self.rejected = 0
        """Durations dropped as not finite or negative (the OTLP histograms drop the same ones)."""
        self.scrapes = ScrapeLog()
        buckets = list(c.DURATION_BUCKETS_S)
        self._step = Histogram("traceml_step_duration_seconds", "Traced step time", labels,
                               buckets=buckets, registry=registry)
        # c.SUM_ONLY_HISTOGRAMS: only _sum and _count are read, so a summary without quantiles
        # (prometheus-client's needs two buckets for a histogram; OTLP sends one +Inf bucket).
        self._phase = Summary("traceml_phase_duration_seconds", "Phase call duration",
                              [*labels, "traceml_phase_name"], registry=registry)
        self._wait = Summary("traceml_step_input_wait_seconds", "Input wait before each step", labels,
                             registry=registry)
        collective_labels = [*labels, "traceml_collective_source", "traceml_collective_kind"]
        self._collective = Summary("traceml_collective_duration_seconds", "Collective time per step",
                                   collective_labels, registry=registry)
        self._collective_exposed = Summary(
            "traceml_collective_exposed_seconds", "Exposed collective time per step", collective_labels,
            registry=registry,
        )
        self._collective_calls = Counter("traceml_collective_calls", "Collective calls", collective_labels,
                                         registry=registry)
        self._collective_bytes = Counter("traceml_collective_bytes", "Collective payload bytes",
                                         collective_labels, registry=registry)
        self._steps = Counter("traceml_steps", "Completed steps", labels, registry=registry)
        self._samples = Counter("traceml_samples", "Samples processed", labels, registry=registry)
        self._tokens = Counter("traceml_tokens", "Tokens processed", labels, registry=registry)
        self._label_values = tuple(self._labels.values())
        self._children: dict[Any, dict[Any, Any]] = {m: {} for m in (
            self._step, self._phase, self._wait, self._collective, self._collective_exposed,
            self._collective_calls, self._collective_bytes, self._steps, self._samples, self._tokens)}
        registry.register(_LiveCollector(self))
        self.server = None
        if endpoint is not None:
            self.server = serve_registry(registry, endpoint, self.scrapes)

    def record(
        self, step_s: float, phases: list[tuple[str, float]], wait_s: float | None,
        memory: tuple[int, int] | None, exemplar_ids: tuple[str, str] | None = None,
    ) -> None:
        exemplar = None if exemplar_ids is None else {"trace_id": exemplar_ids[0], "span_id": exemplar_ids[1]}
        if self._valid(step_s):
            self._child(self._step, None).observe(step_s, exemplar=exemplar)
        for phase, seconds in phases:
            if self._valid(seconds):
                self._child(self._phase, phase).observe(seconds)
        if wait_s is not None and self._valid(wait_s):
            self._child(self._wait, None).observe(wait_s)
        self._child(self._steps, None).inc()
        if memory is not None:
            self._allocated.update(memory[0])
            self._reserved.update(memory[1])

    def _child(self, metric: Any, key: Any) -> Any:
        children = self._children[metric]
        child = children.get(key)
        if child is None:
            extra = () if key is None else key if isinstance(key, tuple) else (key,)
            child = children[key] = metric.labels(*self._label_values, *extra)
        return child

    def _valid(self, seconds: float) -> bool:
        """Whether a duration can be observed; one that is not finite or negative is counted instead."""
        if 0.0 <= seconds < math.inf:
            return True
        self.rejected += 1
        return False

    def record_work(self, samples: int | None, tokens: int | None) -> None:
        """Count a step's samples and tokens (the series appear with the first known count)."""
        if samples is not None:
            self._child(self._samples, None).inc(samples)
        if tokens is not None:
            self._child(self._tokens, None).inc(tokens)

    def record_collectives(self, collectives: list[CollectiveSample]) -> None:
        """One step's collectives, per (source, kind): total and exposed time when measured, calls, bytes."""
        for one in collectives:
            key = (one.source, one.kind)
            if one.seconds is not None and self._valid(one.seconds):
                self._child(self._collective, key).observe(one.seconds)
            if one.exposed is not None and self._valid(one.exposed):
                self._child(self._collective_exposed, key).observe(one.exposed)
            self._child(self._collective_calls, key).inc(one.calls)
            self._child(self._collective_bytes, key).inc(one.nbytes)

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
        gauge("traceml_run_ended", "1 once this rank ended and said so, else 0", state.ended)
        seconds, phase = state.stalled()
        stalled = GaugeMetricFamily("traceml_progress_stalled_seconds",
                                    "Seconds without progress once a hang was seen (0 otherwise)",
                                    labels=[*keys, "traceml_phase_name"])
        stalled.add_metric([*values, phase], seconds)
        families.append(stalled)
        families += state.time.prometheus_families(keys, values)
        if state.exit is not None:
            end = GaugeMetricFamily("traceml_run_exit", "Always 1 once the rank ended; labels say how",
                                    labels=[*keys, "traceml_exit_status", "traceml_exit_reason"])
            end.add_metric([*values, *state.exit], 1)
            families.append(end)
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


class _LiveCollector:
    """Adapter: prometheus_client calls ``collect()`` on every scrape."""

    def __init__(self, owner: PrometheusStepMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[object]:
        return self._owner.collect_live()

    def describe(self) -> list[object]:
        return []  # no up-front description: collect() must not run (or count) at registration


def serve_registry(registry: object, endpoint: PrometheusEndpoint, scrapes: ScrapeLog) -> Any:
    """Serve ``registry`` with prometheus-client's WSGI app on a daemon thread, noting each scrape's
    address in ``scrapes`` (how often each scraper comes decides the linger at the end)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

    app = make_wsgi_app(registry)  # type: ignore[arg-type]

    def noting(environ: dict[str, Any], start_response: Any) -> Any:
        scrapes.scraped(str(environ.get("REMOTE_ADDR", "")))
        return app(environ, start_response)

    server_class = ThreadingWSGIServer
    if ":" in endpoint.address:
        server_class = type("ThreadingWSGIServer6", (ThreadingWSGIServer,),
                            {"address_family": socket.AF_INET6})
    server = make_server(endpoint.address, endpoint.port, noting, server_class, handler_class=QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="traceml-scrape").start()
    return server
