"""``TRACEML_SHUTDOWN_TIMEOUT_S`` bounds all OTLP export at shutdown, spans and metrics together."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.emit.test_emitter_faults import _hello, _rows
from tests.launch.test_faults import _blackhole
from traceml_otel.emit.worker import Emitter


@pytest.mark.parametrize("timeout_s", [1.0, 3.0])
def test_an_endpoint_that_never_answers_holds_shutdown_for_the_setting_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout_s: float
) -> None:
    server, endpoint = _blackhole()  # accepts and reads, never answers: each export would hang 30 s
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    try:
        emitter = Emitter(_hello(tmp_path, shutdown_timeout_s=timeout_s, traces_endpoint=endpoint,
                                 traces_protocol="http/protobuf", metrics_endpoint=endpoint,
                                 metrics_protocol="http/protobuf"))
        assert emitter.shipper is not None and emitter.metrics is not None
        emitter.handle_steps(_rows(0, 50))
        while emitter.has_export_work:
            emitter.export_next()
        emitter.finish_local("ok", 0, True, steps_traced=50)
        started = time.monotonic()
        emitter.finish_export()
        took = time.monotonic() - started
    finally:
        server.close()
    assert took >= 0.6 * timeout_s, "it waited for the export, as long as the setting allows"
    assert took <= timeout_s + 2.0, f"OTLP export held shutdown {took:.1f} s past a {timeout_s} s deadline"
    stats = emitter.stats
    assert stats.final and stats.otlp_exported == 0 and stats.otlp_dropped == 100  # 50 steps x 2 spans
