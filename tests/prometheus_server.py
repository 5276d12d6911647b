"""A real Prometheus (Debian's) for the tests and benchmarks, and the static exposition endpoints they
scrape: one place that writes the configuration, starts the server on a free loopback port, waits
until it is ready and stops it."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.ports import free_port
from tests.tools import PROMETHEUS
from tests.waiting import wait_for


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, timeout_s: float = 5, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=timeout_s) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def series_times(self, expr: str, start: float, end: float) -> list[float]:
        """Timestamps (1 s resolution) at which ``expr`` had a value."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        return sorted(float(t) for series in data["result"] for t, _ in series["values"])

    def wait_ready(self, timeout_s: float = 30) -> Prometheus:
        """Wait until it answers ``/-/ready`` (fails the test with its log otherwise)."""
        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200

        wait_for(ready, timeout_s, "prometheus not ready", self.log, poll_s=0.1)
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def start_prometheus(folder: Path, scrape_configs: list[dict[str, Any]], *, rules_dir: Path | None = None,
                     scrape_interval: str = "1s", evaluation_interval: str = "1s",
                     external_labels: dict[str, str] | None = None, flags: Sequence[str] = (),
                     port: int | None = None) -> Prometheus:
    """A real Prometheus on 127.0.0.1 (a free port unless given), its configuration, data and log
    (``prometheus.log``) in ``folder``; with ``rules_dir``, it evaluates the rendered
    ``recording.yml`` and ``alerts.yml`` there."""
    folder.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"scrape_interval": scrape_interval,
                                "evaluation_interval": evaluation_interval}
    if external_labels:
        settings["external_labels"] = external_labels
    config: dict[str, Any] = {"global": settings, "scrape_configs": scrape_configs}
    if rules_dir is not None:
        config["rule_files"] = [str(rules_dir / "recording.yml"), str(rules_dir / "alerts.yml")]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port() if port is None else port
    log = folder / "prometheus.log"
    assert PROMETHEUS is not None, "prometheus is not installed (the caller marks requires_tool)"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
             f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={folder / 'data'}", *flags],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    return Prometheus(f"http://127.0.0.1:{port}", proc, log)


@contextmanager
def running_prometheus(folder: Path, scrape_configs: list[dict[str, Any]],
                       **options: Any) -> Iterator[Prometheus]:
    """:func:`start_prometheus`, ready, stopped at the end."""
    server = start_prometheus(folder, scrape_configs, **options)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def static_targets(job: str, targets: Sequence[str]) -> dict[str, Any]:
    """One scrape job of fixed ``host:port`` targets."""
    return {"job_name": job, "static_configs": [{"targets": list(targets)}]}


def serve_exposition(body: Callable[[], bytes], port: int = 0) -> ThreadingHTTPServer:
    """Serve the Prometheus text exposition ``body()`` on 127.0.0.1 (``port``, 0: a free one) from a
    daemon thread; ``server.server_address[1]`` is the port, ``shutdown()`` and ``server_close()`` end it."""

    class Exposition(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Exposition)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
