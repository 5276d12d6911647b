"""The launcher's last word on a failed run: which rank failed first, always on stderr, and the one
series ``traceml_run_first_failure`` on the first rank's port when that port is free.

Seen in CI: a rank stopped after the failure still lingered on the port in its emitter process, the
launcher's bind was refused, and the terminal never said which rank failed first."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from tests.launch.first_failure_job import FIRST_FAILURE, scrape
from tests.ports import free_port
from traceml_otel.emit.prometheus_scrape import PrometheusEndpoint, serve_registry
from traceml_otel.emit.run_end import ScrapeLog
from traceml_otel.launch.child_watch import FirstFailure
from traceml_otel.launch.exit_endpoint import serve_first_failure

FIRST = FirstFailure(rank=1, how="exit code 3", exit_code=3)


def _env(tmp_path: Path, port: int | None, linger_s: float = 1.0) -> dict[str, str]:
    env = {"TRACEML_RUNS_DIR": str(tmp_path), "TRACEML_RUN_ID": "sx"}
    if port is not None:
        env.update(TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S=str(linger_s))
    return env


def test_a_free_port_serves_the_first_failure_for_the_linger(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    pages: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not pages:
            page = scrape(port)
            if FIRST_FAILURE in page:
                pages.append(page)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    served = serve_first_failure(FIRST, _env(tmp_path, port), rank=0)
    watcher.join()
    assert served >= 0.9
    (line,) = [x for x in pages[0].splitlines() if x.startswith(FIRST_FAILURE)]
    assert 'traceml_first_failure_rank="1"' in line and 'traceml_rank="0"' in line, line
    err = capsys.readouterr().err
    assert "traceml: rank 1 failed first (exit code 3); keeping the metrics endpoint up 1 s" in err, err
    assert scrape(port) == ""  # closed after the linger


def test_a_port_held_by_something_else_still_names_the_rank(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()  # accepts, never answers: the probe gives up within its time bound
        started = time.monotonic()
        assert serve_first_failure(FIRST, _env(tmp_path, port), rank=0) == 0.0
        assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert f"traceml: rank 1 failed first (exit code 3); cannot serve it on port {port}" in err, err
    assert "the manifest has it" in err


def test_a_port_held_by_a_lingering_rank_that_serves_it_says_so(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    registry = CollectorRegistry()
    Gauge("traceml_run_first_failure", "as a rank's emitter serves it", ["traceml_first_failure_rank"],
          registry=registry).labels("1").set(1)
    server = serve_registry(registry, PrometheusEndpoint(port, "127.0.0.1"), ScrapeLog())
    try:
        assert serve_first_failure(FIRST, _env(tmp_path, port), rank=0) == 0.0
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert (f"traceml: rank 1 failed first (exit code 3); a rank's endpoint still lingering on port {port} "
            "serves it") in err, err


@pytest.mark.parametrize("port", [None, "linger off"])
def test_without_an_endpoint_the_rank_is_still_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     port: str | None) -> None:
    env = _env(tmp_path, None) if port is None else _env(tmp_path, free_port(), linger_s=0)
    assert serve_first_failure(FIRST, env, rank=0) == 0.0
    assert capsys.readouterr().err.strip() == "traceml: rank 1 failed first (exit code 3)"
