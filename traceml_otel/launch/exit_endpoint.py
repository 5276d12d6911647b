"""After the ranks are gone, the launcher says on their scrape port which rank failed first.

A process cannot see its own exit code before its endpoint closes: a top-level ``raise
SystemExit(3)`` leaves the rank saying ``clean``, and a rank killed outright says nothing. Only the
parent sees both (launch/child_watch.py). When ``traceml run`` saw a rank fail and the ranks serve
Prometheus (``TRACEML_PROMETHEUS_PORT``), the launcher serves, once every rank exited, on this node's
first rank port (the one every PodMonitor scrapes) for the ranks' linger
(``TRACEML_PROMETHEUS_LINGER_S``), the one series ``traceml_run_first_failure`` with that rank's job
and run labels, so ``TraceMLJobFailed`` fires with the rank and how it ended.

The launcher always says on stderr which rank failed first, whether it serves it or not. The port can
still be held when it tries: a rank stopped after the failure lingers for the last scrape in its own
emitter process, and that endpoint already serves the series (it reads the manifest). The line then
says the rank's endpoint has it; any other holder, or unusable settings, skip the serving with a
line, never an error.
"""

from __future__ import annotations

import sys
import time
import urllib.request
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
    """Say on stderr which rank failed first, and serve it on ``rank``'s port for the ranks' linger;
    the seconds it served (0: not served)."""
    said = f"traceml: rank {first.rank} failed first ({first.how})"
    try:
        settings = load_settings({**env, "RANK": str(rank), "LOCAL_RANK": "0"})
    except SettingsError:
        settings = None
    if settings is None or not settings.prometheus_port or settings.prometheus_linger_s <= 0:
        _say(said)
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
        if _already_served(endpoint.address, endpoint.port):
            _say(f"{said}; a rank's endpoint still lingering on port {endpoint.port} serves it")
        else:
            _say(f"{said}; cannot serve it on port {endpoint.port} ({error.strerror or error}); "
                 "the manifest has it")
        return 0.0
    linger = settings.prometheus_linger_s
    _say(f"{said}; keeping the metrics endpoint up {linger:.0f} s so the stack sees it")
    started = time.monotonic()
    try:
        time.sleep(linger)
    finally:
        server.shutdown()
        server.server_close()
    return time.monotonic() - started


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _already_served(address: str, port: int) -> bool:
    """Whether the endpoint holding ``address:port`` serves ``traceml_run_first_failure`` (one read,
    bounded by time and size)."""
    host = f"[{address}]" if ":" in address else address
    if host in ("0.0.0.0", "[::]"):
        host = "127.0.0.1"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=_PROBE_TIMEOUT_S) as reply:
            page = reply.read(_PROBE_MAX_BYTES)
    except (OSError, ValueError):
        return False
    return b"traceml_run_first_failure{" in page


_PROBE_TIMEOUT_S = 1.0
_PROBE_MAX_BYTES = 4 << 20
