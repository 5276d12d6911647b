"""After the ranks are gone, the launcher says on their scrape port which rank failed first.

A process cannot see its own exit code before its endpoint closes: a top-level ``raise
SystemExit(3)`` leaves the rank saying ``clean``, and a rank killed outright says nothing. Only the
parent sees both (launch/child_watch.py). When ``traceml run`` saw a rank fail and the ranks serve
Prometheus (``TRACEML_PROMETHEUS_PORT``), the launcher serves, once every rank exited, on this node's
first rank port (the one every PodMonitor scrapes) for the ranks' linger
(``TRACEML_PROMETHEUS_LINGER_S``), the one series ``traceml_run_first_failure`` with that rank's job
and run labels, so ``TraceMLJobFailed`` fires with the rank and how it ended. It says so on stderr; a
busy port or unusable settings skip it with a line, never an error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping

from traceml_otel.errors import SettingsError
from traceml_otel.launch.child_watch import FirstFailure
from traceml_otel.settings import load_settings


class _FirstFailureCollector:
    def __init__(self, labels: dict[str, str], first: FirstFailure) -> None:
        self.labels, self.first = labels, first

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "traceml_run_first_failure", "Always 1 after the end once the launcher saw a rank fail first",
            labels=[*self.labels, "traceml_first_failure_rank", "traceml_first_failure_reason"])
        family.add_metric([*self.labels.values(), str(self.first.rank), self.first.how[:64]], 1)
        yield family


def serve_first_failure(first: FirstFailure, env: Mapping[str, str], rank: int) -> float:
    """Serve the first failure on ``rank``'s port for the ranks' linger; the seconds it served (0: not)."""
    try:
        settings = load_settings({**env, "RANK": str(rank), "LOCAL_RANK": "0"})
    except SettingsError:
        return 0.0
    if not settings.prometheus_port or settings.prometheus_linger_s <= 0:
        return 0.0
    from prometheus_client import CollectorRegistry

    from traceml_otel.emit.prometheus_scrape import PrometheusEndpoint, serve_registry
    from traceml_otel.emit.run_end import ScrapeLog

    registry = CollectorRegistry()
    labels = {"traceml_job": settings.job or settings.run_id, "traceml_run_id": settings.run_id,
              "traceml_rank": str(rank)}
    registry.register(_FirstFailureCollector(labels, first))  # type: ignore[arg-type]
    endpoint = PrometheusEndpoint(settings.prometheus_port, settings.prometheus_addr or "127.0.0.1")
    try:
        server = serve_registry(registry, endpoint, ScrapeLog())
    except OSError as error:
        print(f"traceml: cannot serve rank {first.rank}'s failure on port {endpoint.port} "
              f"({error.strerror or error}); the manifest has it", file=sys.stderr, flush=True)
        return 0.0
    linger = settings.prometheus_linger_s
    print(f"traceml: rank {first.rank} failed first ({first.how}); keeping the metrics endpoint up "
          f"{linger:.0f} s so the stack sees it", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        time.sleep(linger)
    finally:
        server.shutdown()
        server.server_close()
    return time.monotonic() - started
