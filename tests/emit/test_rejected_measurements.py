"""Measurements the duration histograms drop (not finite, negative) are counted into the rank's
export statistics, written to ``rank-R.export.json`` and said in the launcher's account."""

from __future__ import annotations

import math
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from tests.emit.test_emitter_faults import _hello, _rows
from tests.emit.test_histogram_accumulator import _step
from tests.ports import free_port
from traceml_otel import contract as c
from traceml_otel.emit import stats_file
from traceml_otel.emit.step_metrics import PrometheusEndpoint, RankLabels, StepMetrics
from traceml_otel.emit.worker import Emitter
from traceml_otel.launch.export_report import MAX_RANKS_NAMED, render_export_report
from traceml_otel.wire.export_stats import ExportStats, read_export_stats_file
from traceml_otel.wire.step_row import PhaseRow


def test_step_metrics_count_nan_inf_and_negative_durations() -> None:
    """The real StepMetrics path: a NaN step on the GPU clock, an infinite phase, a negative input
    wait are each dropped from their histogram and counted; the valid measurements still count."""
    reader = InMemoryMetricReader()
    metrics = StepMetrics(Resource.create({}), RankLabels("r", 0, 0, "h", "0"), None, metric_reader=reader)
    good, spans = _step(0)
    nan_step = replace(good, gpu_duration_ns=math.nan, phases=())  # the step histogram only
    inf_phase = replace(good, phases=(replace(good.phases[0], gpu_duration_ns=math.inf),),
                        gpu_duration_ns=100_000_000)
    negative_wait = replace(good, input_wait_ns=-5)
    metrics.record_batch([(good, spans, True), (nan_step, spans, False), (inf_phase, spans, False),
                          (negative_wait, spans, False)])
    assert metrics.values_rejected == 3
    points = {m.name: m.data.data_points for r in reader.get_metrics_data().resource_metrics
              for sc in r.scope_metrics for m in sc.metrics}
    metrics.shutdown(1.0)
    assert [p.count for p in points[c.METRIC_STEP_DURATION]] == [3]  # the NaN step left out
    assert [p.count for p in points[c.METRIC_STEP_INPUT_WAIT]] == [3]  # the negative wait left out
    assert StepMetrics(Resource.create({}), RankLabels("r", 0, 0, "h", "0"), None).values_rejected == 0


def test_the_scrape_path_drops_and_counts_the_same_values() -> None:
    """Without OTLP metrics the scrape endpoint's count is the one reported; prometheus-client would
    have taken the NaN (its ``_sum`` NaN for good) and the negative wait (in the first bucket)."""
    port = free_port()
    metrics = StepMetrics(Resource.create({}), RankLabels("r", 0, 0, "h", "0"), None,
                          prometheus=PrometheusEndpoint(port))
    try:
        good, spans = _step(0)
        metrics.record_batch([(good, spans, True), (replace(good, gpu_duration_ns=math.nan), spans, False),
                              (replace(good, input_wait_ns=-5), spans, False)])
        assert metrics.values_rejected == 2
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        metrics.linger(0.0)
    sums = [line for line in text.splitlines() if line.startswith("traceml_") and "_sum{" in line]
    assert sums and not [line for line in sums if "NaN" in line], sums
    step, wait = "traceml_step_duration_seconds_count", "traceml_step_input_wait_seconds_count"
    counts = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith((step, wait))}
    assert counts == {step: 2, wait: 2}


def _backwards(first: int, count: int) -> list:
    """Steps whose forward phase ends before it starts (a clock that stepped back)."""
    rows = _rows(first, count)
    for row in rows:
        start = row.start_ns
        row.phases[0] = PhaseRow.timed("forward", 0, start + 500_000, start + 10, None)
    return rows


def test_rejected_values_reach_the_statistics_file_and_the_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the emitter: the count is written while the run lasts (the pipe's idle refresh) and in
    the final statistics, and the launcher's account says it once, with the rank."""
    endpoint = f"http://127.0.0.1:{free_port()}"  # refused: the final export fails at once
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    monkeypatch.setattr(stats_file, "STATS_INTERVAL_S", 0.0)
    emitter = Emitter(_hello(tmp_path, metrics_endpoint=endpoint, metrics_protocol="http/protobuf"))
    emitter.handle_steps(_rows(0, 3) + _backwards(3, 4))
    while emitter.has_export_work:
        emitter.export_next()
    path = tmp_path / c.export_stats_file_name(0)
    assert read_export_stats_file(path).metric_values_rejected == 0  # written before the metrics ran
    emitter.refresh_stats()  # what the pipe does when idle: the count moved, so it is written
    running = read_export_stats_file(path)
    assert running.metric_values_rejected == 4 and not running.final
    emitter.finish("ok", 0, True, steps_traced=7)
    stats = read_export_stats_file(path)
    assert stats.final and stats.metric_values_rejected == 4 and stats.local_copy_complete
    assert stats.metrics_skipped_steps == 0  # the steps themselves were recorded
    account = render_export_report(tmp_path)
    lines = [line for line in account.splitlines() if "not finite or negative" in line]
    assert len(lines) == 1 and "metrics: 4 measurements" in lines[0] and "(rank 0: 4)" in lines[0]


def test_the_account_line_stays_one_line_at_1024_ranks(tmp_path: Path) -> None:
    exports = [ExportStats(run_id="r", rank=r, metric_values_rejected=r % 3, final=True, clean_shutdown=True,
                           end_status="ok") for r in range(1024)]
    account = render_export_report(tmp_path, exports)
    lines = [line for line in account.splitlines() if "not finite or negative" in line]
    rejecting = [e for e in exports if e.metric_values_rejected]
    assert len(lines) == 1 and f"metrics: {sum(e.metric_values_rejected for e in rejecting)} " in lines[0]
    assert lines[0].count("rank ") == MAX_RANKS_NAMED and "rank 2: 2" in lines[0]  # the most first
    assert f"and {len(rejecting) - MAX_RANKS_NAMED} more ranks" in lines[0]
    assert "not finite" not in render_export_report(tmp_path, [replace(e, metric_values_rejected=0)
                                                              for e in exports])
