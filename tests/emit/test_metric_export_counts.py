"""Failed OTLP metric exports are counted, as span drops are: a real SDK exporter against a refused
port, and against a live OTLP receiver for the delivered side."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.emit.test_emitter_faults import _hello as emitter_hello
from tests.emit.test_emitter_faults import _rows as emitter_rows
from tests.integration.otlp_receiver import OtlpHttpReceiver
from tests.ports import free_port
from traceml_otel import contract as c
from traceml_otel.emit.worker import Emitter
from traceml_otel.launch.export_report import render_export_report
from traceml_otel.wire.export_stats import read_export_stats_file
from traceml_otel.wire.hello import Hello


def _rows(first: int, count: int) -> list[list]:
    return emitter_rows(first, count)


def _hello(run_dir: Path, endpoint: str) -> Hello:
    return emitter_hello(run_dir, metrics_endpoint=endpoint, metrics_protocol="http/protobuf")


def _refused_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a port that was free a moment ago: nothing listens there


def _run_emitter(
    tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch, *, until_failed: bool
) -> Emitter:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    emitter = Emitter(_hello(tmp_path, endpoint))
    for first in range(0, 40, 10):
        emitter.handle_steps(_rows(first, 10))
        while emitter.has_export_work:
            emitter.export_next()
        time.sleep(0.1)
    deadline = time.monotonic() + 30
    while until_failed and time.monotonic() < deadline:  # a failed export (connect, one retry) takes ~1 s
        counts = emitter.metrics.export_counts if emitter.metrics else None
        if counts is not None and counts.failed:
            break
        time.sleep(0.05)
    emitter.finish("ok", 0, True, steps_traced=40)
    return emitter


def test_metric_exports_to_a_refused_port_are_counted_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = _refused_endpoint()
    started = time.monotonic()
    emitter = _run_emitter(tmp_path, endpoint, monkeypatch, until_failed=True)
    elapsed = time.monotonic() - started
    stats = read_export_stats_file(tmp_path / c.export_stats_file_name(0))
    assert stats == emitter.stats
    assert stats.metrics_endpoint == endpoint
    assert stats.metric_exports == 0 and stats.metric_export_failures >= 1
    assert stats.metric_last_error is not None and "refused" in stats.metric_last_error
    assert stats.local_copy_complete is True  # the other outputs go on
    warned = [line for line in capsys.readouterr().err.splitlines() if "OTLP metric export" in line]
    assert len(warned) == 1 and warned[0].startswith("traceml: rank 0: OTLP metric export (http/protobuf)")
    account = render_export_report(tmp_path)
    failed = stats.metric_export_failures
    assert f"OTLP metrics to {endpoint}: 0 exports delivered, {failed} failed" in account
    assert elapsed < 60  # loose: a dead endpoint must not hold the emitter for long


def test_metric_exports_to_a_live_receiver_are_counted_as_delivered(tmp_path: Path, monkeypatch) -> None:
    with OtlpHttpReceiver() as receiver:
        emitter = _run_emitter(tmp_path, receiver.endpoint, monkeypatch, until_failed=False)
        received = receiver.metrics()
    assert emitter.stats.metric_exports >= 1 and emitter.stats.metric_export_failures == 0
    assert any(m.metric.name == c.METRIC_STEPS for m in received)
