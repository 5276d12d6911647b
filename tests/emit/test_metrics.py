"""The emitter's metric set on both paths: OTLP (read in memory) and the direct scrape endpoint."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.ports import free_port
from traceml_otel import contract as c
from traceml_otel.emit.run_end import ScrapeLog, exit_of, linger_seconds
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder
from traceml_otel.emit.step_metrics import IntervalPeak, PrometheusEndpoint, RankLabels, StepMetrics
from traceml_otel.step_records import StepRecord

LABELS = RankLabels(run_id="r1", rank=3, local_rank=1, host="node-a", version="9.9.9", job="nightly",
                   world_size=4)
BUILDER = StepSpanBuilder(
    RankInfo(run_id="r1", rank=3, local_rank=1, world_size=4, node_rank=0, host="node-a")
)
S = 1_000_000_000


def step(n: int, seconds: float = 0.1, wait: float | None = 0.02, memory: tuple[int, int] | None = None):
    start = 1_700_000_000 * S + n * S
    record = StepRecord(
        step=n, start_ns=start, end_ns=start + int(seconds * S), input_wait_ns=None if wait is None
        else int(wait * S), input_fetches=0 if wait is None else 1,
        peak_allocated_bytes=None if memory is None else memory[0],
        peak_reserved_bytes=None if memory is None else memory[1],
    )
    return record, BUILDER.build(record)


def test_interval_peak_is_the_max_since_the_last_read() -> None:
    peak = IntervalPeak()
    assert peak.take() is None  # nothing measured: absent, not 0
    for value in (5, 9, 7):
        peak.update(value)
    assert peak.take() == 9  # the spike between two reads is kept
    peak.update(3)
    assert peak.take() == 3  # a new interval starts after each read
    assert peak.take() == 3  # no step since: the last maximum, the series does not vanish


def otlp_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource_metrics in data.resource_metrics if data else []:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def test_otlp_metric_set() -> None:
    dropped = [0]
    reader = InMemoryMetricReader()
    metrics = StepMetrics(Resource.create({}), LABELS, None, dropped_spans=lambda: dropped[0],
                          metric_reader=reader)
    first = otlp_points(reader)
    assert [p.value for p in first[c.METRIC_SPANS_DROPPED]] == [0]  # present at 0 before any step
    assert [p.value for p in first[c.METRIC_RUN_ENDED]] == [0]
    assert [p.value for p in first[c.METRIC_WORLD_SIZE]] == [4]
    (info,) = first[c.METRIC_RANK_INFO]
    assert info.value == 1
    assert dict(info.attributes) == {
        c.ATTR_JOB: "nightly", c.ATTR_RUN_ID: "r1", c.ATTR_RANK: 3, c.ATTR_HOST: "node-a",
        c.ATTR_LOCAL_RANK: 1,
        c.ATTR_CUDA_DEVICE: "", c.ATTR_GPU_UUID: "", c.ATTR_VERSION: "9.9.9",
    }
    assert c.METRIC_LAST_STEP_TIMESTAMP not in first  # no step yet: absent

    for n, (seconds, wait, reserved) in enumerate([(0.1, 0.02, 500), (0.1, 0.04, 900), (0.1, None, 700)]):
        record, spans = step(n, seconds, wait, (100, reserved))
        metrics.record(record, spans)
    dropped[0] = 12  # the shipper dropped spans: the next export says so, while the run goes on
    metrics.set_device(2, "GPU-0000-aaaa")
    second = otlp_points(reader)
    assert [p.value for p in second[c.METRIC_SPANS_DROPPED]] == [12]
    (wait_hist,) = second[c.METRIC_STEP_INPUT_WAIT]
    assert wait_hist.count == 2 and wait_hist.sum == pytest.approx(0.06)  # only measured steps count
    assert [p.value for p in second[c.METRIC_MEM_PEAK_RESERVED]] == [900]  # max over the interval
    assert [p.value for p in second[c.METRIC_INPUT_WAIT]] == [pytest.approx(0.04)]  # last measured step
    (last,) = second[c.METRIC_LAST_STEP_TIMESTAMP]
    assert last.value == pytest.approx(1_700_000_002.1)
    (info,) = second[c.METRIC_RANK_INFO]
    assert info.attributes[c.ATTR_CUDA_DEVICE] == "2" and info.attributes[c.ATTR_GPU_UUID] == "GPU-0000-aaaa"
    (steps,) = second[c.METRIC_STEPS]
    assert steps.value == 3
    (step_hist,) = second[c.METRIC_STEP_DURATION]
    assert step_hist.exemplars and {e.trace_id for e in step_hist.exemplars} <= {
        c.step_trace_id("r1", n) for n in range(3)
    }

    record, spans = step(3, memory=(100, 600))
    metrics.record(record, spans)
    assert [p.value for p in otlp_points(reader)[c.METRIC_MEM_PEAK_RESERVED]] == [600]  # a new interval
    assert c.METRIC_RUN_EXIT not in otlp_points(reader)  # running: no exit status yet
    metrics.mark_ended("exception OutOfMemoryError")
    final = otlp_points(reader)
    assert [p.value for p in final[c.METRIC_RUN_ENDED]] == [1]
    (exit_point,) = final[c.METRIC_RUN_EXIT]
    assert exit_point.value == 1 and dict(exit_point.attributes) == {
        c.ATTR_JOB: "nightly", c.ATTR_RUN_ID: "r1", c.ATTR_RANK: 3,
        c.ATTR_EXIT_STATUS: "exception", c.ATTR_EXIT_REASON: "OutOfMemoryError",
    }
    metrics.shutdown(1.0)


def scrape(port: int) -> tuple[str, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read().decode()
    return body, {family.name: family for family in text_string_to_metric_families(body)}


def test_direct_scrape_metric_set() -> None:
    dropped = [0]
    port = free_port()
    metrics = StepMetrics(Resource.create({}), LABELS, None, PrometheusEndpoint(port),
                          dropped_spans=lambda: dropped[0])
    try:
        _, families = scrape(port)
        (sample,) = families["traceml_export_dropped_spans"].samples[:1]
        assert sample.name == "traceml_export_dropped_spans_total" and sample.value == 0
        assert families["traceml_world_size"].samples[0].value == 4
        assert families["traceml_run_ended"].samples[0].value == 0
        (info,) = families["traceml_rank_info"].samples
        assert info.labels == {
            "traceml_job": "nightly", "traceml_run_id": "r1", "traceml_rank": "3", "traceml_host": "node-a",
            "traceml_local_rank": "1",
            "traceml_cuda_device": "", "traceml_gpu_uuid": "", "traceml_version": "9.9.9",
        }
        assert "traceml_step_last_timestamp_seconds" not in families
        assert "traceml_cuda_memory_peak_reserved_bytes" not in families

        for n, reserved in enumerate((500, 900, 700)):
            record, spans = step(n, memory=(100, reserved))
            metrics.record(record, spans, exemplar=n != 1)  # step 1's trace was sampled out
        dropped[0] = 4
        metrics.set_device(0, "GPU-1234")
        _, families = scrape(port)
        assert families["traceml_export_dropped_spans"].samples[0].value == 4
        assert families["traceml_cuda_memory_peak_reserved_bytes"].samples[0].value == 900
        last_step = families["traceml_step_last_timestamp_seconds"].samples[0].value
        assert last_step == pytest.approx(1_700_000_002.1)
        assert families["traceml_rank_info"].samples[0].labels["traceml_gpu_uuid"] == "GPU-1234"
        wait = {s.name: s.value for s in families["traceml_step_input_wait_seconds"].samples}
        assert wait["traceml_step_input_wait_seconds_count"] == 3
        assert wait["traceml_step_input_wait_seconds_sum"] == pytest.approx(0.06)
        exemplars = [s.exemplar for s in families["traceml_step_duration_seconds"].samples if s.exemplar]
        sampled = {f"{c.step_trace_id('r1', n):032x}" for n in (0, 2)}
        assert exemplars and {e.labels["trace_id"] for e in exemplars} <= sampled
        assert families["traceml_steps"].samples[0].value == 3
        _, families = scrape(port)
        assert families["traceml_cuda_memory_peak_reserved_bytes"].samples[0].value == 900  # no new step

        assert "traceml_run_exit" not in families  # still running
        metrics.mark_ended("SIGTERM")
        done = threading.Event()
        lingering = threading.Thread(target=lambda: (metrics.linger(2.0), done.set()))
        started = time.monotonic()
        lingering.start()
        _, families = scrape(port)  # one replica of an HA pair scrapes the end ...
        assert families["traceml_run_ended"].samples[0].value == 1
        (exit_sample,) = families["traceml_run_exit"].samples
        assert exit_sample.value == 1 and exit_sample.labels["traceml_exit_status"] == "signal"
        assert exit_sample.labels["traceml_exit_reason"] == "SIGTERM"
        assert exit_sample.labels["traceml_job"] == "nightly"
        time.sleep(0.5)
        assert not done.is_set()  # ... and the endpoint stays up for the other one
        _, families = scrape(port)
        assert families["traceml_run_ended"].samples[0].value == 1
        lingering.join(10)
        assert done.is_set() and time.monotonic() - started >= 1.9  # the whole linger, then closed
        with pytest.raises(OSError):
            scrape(port)
        assert not any(name.endswith("_created") for name in families)  # nothing reads them
    finally:
        metrics.linger(0)


def test_direct_scrape_binds_the_configured_address() -> None:
    port = free_port()
    metrics = StepMetrics(Resource.create({}), LABELS, None, PrometheusEndpoint(port, "127.0.0.2"))
    try:
        assert metrics._prometheus is not None
        assert metrics._prometheus.server.server_address[0] == "127.0.0.2"
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=2) as response:
            assert b"traceml_rank_info" in response.read()
    finally:
        metrics.linger(0)


def test_exit_status_of_each_goodbye() -> None:
    assert exit_of("ok") == ("clean", "")
    assert exit_of("exception OutOfMemoryError") == ("exception", "OutOfMemoryError")
    assert exit_of("exception torch.distributed.DistBackendError") == (
        "exception", "torch.distributed.DistBackendError")
    assert exit_of("SIGTERM") == ("signal", "SIGTERM")
    assert exit_of("SIGINT (Ctrl-C)") == ("signal", "SIGINT")
    assert exit_of('exception E"vil{x}\n') == ("exception", "Evilx")  # a label value stays plain
    assert {status for status, _ in map(exit_of, ("ok", "exception E", "SIGTERM"))} == set(c.EXIT_STATUSES)


def test_linger_covers_the_longest_interval_any_scraper_was_seen_at() -> None:
    log = ScrapeLog()
    for t in (0.0, 60.0, 120.0):  # a single Prometheus at 60 s
        log.scraped("10.0.0.7", now=t)
    for t in (5.0, 20.0, 35.0, 50.0):  # another at 15 s
        log.scraped("10.0.0.8", now=t)
    assert log.longest_interval_s == 60.0
    assert linger_seconds(20.0, log.longest_interval_s) == 65.0  # the 60 s scraper sees the end
    assert linger_seconds(20.0, 10.0) == 20.0  # the configured minimum (an HA pair on one address)
    assert linger_seconds(20.0, 0.0) == 20.0  # fewer than two scrapes: nothing learned
    assert linger_seconds(20.0, 3600.0) == 120.0  # bounded: exit never waits longer
    assert linger_seconds(300.0, 10.0) == 300.0  # a configured linger above the bound is used
    assert linger_seconds(0.0, 60.0) == 0.0  # turned off


def test_a_batch_counts_exactly_what_step_by_step_recording_counts() -> None:
    """``record_batch`` moves the counters once per batch: the same totals as one call per step."""
    def recorded(batched: bool) -> dict[str, list[Any]]:
        reader = InMemoryMetricReader()
        metrics = StepMetrics(Resource.create({}), LABELS, None, metric_reader=reader)
        steps = []
        for n in range(7):
            record, spans = step(n)
            record = replace(record, samples=32 if n % 2 else None, tokens=100 if n < 3 else None)
            steps.append((record, spans, n != 4))
        if batched:
            metrics.record_batch(steps[:5])
            metrics.record_batch(steps[5:])
        else:
            for record, spans, exemplar in steps:
                metrics.record(record, spans, exemplar)
        return otlp_points(reader)

    batched, one_by_one = recorded(True), recorded(False)
    for name in (c.METRIC_STEPS, c.METRIC_SAMPLES, c.METRIC_TOKENS):
        assert [p.value for p in batched[name]] == [p.value for p in one_by_one[name]]
    assert [p.value for p in batched[c.METRIC_STEPS]] == [7]
    assert [p.value for p in batched[c.METRIC_SAMPLES]] == [3 * 32]
    assert [p.value for p in batched[c.METRIC_TOKENS]] == [300]
    for name in (c.METRIC_STEP_DURATION, c.METRIC_STEP_INPUT_WAIT):
        assert sum(p.count for p in batched[name]) == sum(p.count for p in one_by_one[name]) > 0


@pytest.mark.parametrize("otlp", [False, True])
def test_a_ddp_step_is_recorded_with_or_without_otlp_metrics(otlp: bool) -> None:
    """A step with collectives (a DDP rank's) on the scrape path alone, and with OTLP metrics too
    (CI once saw the scrape-only batch path reach for the OTLP collective histograms)."""
    from traceml_otel.step_records import CollectiveTiming

    port = free_port()
    reader = InMemoryMetricReader() if otlp else None
    metrics = StepMetrics(Resource.create({}), LABELS, None, PrometheusEndpoint(port), metric_reader=reader)
    try:
        batch = []
        for n in range(3):
            record, _ = step(n)
            record = replace(record, collectives=(
                CollectiveTiming("all_reduce", "ddp", record.start_ns + S // 100, record.start_ns + S // 50,
                                 4096, False),))
            batch.append((record, BUILDER.build(record), True))
        metrics.record_batch(batch)
        _, families = scrape(port)
        calls = {s.name: s.value for s in families["traceml_collective_calls"].samples}
        assert calls == {"traceml_collective_calls_total": 3}
        if reader is not None:
            points = otlp_points(reader)
            assert [p.count for p in points[c.METRIC_COLLECTIVE_DURATION]] == [3]
            assert [p.value for p in points[c.METRIC_COLLECTIVE_CALLS]] == [3]
    finally:
        metrics.linger(0)


def test_the_first_failure_is_read_soon_after_it_is_written(tmp_path) -> None:
    """A rank that ended before the launcher wrote the first failure sees it within a fraction of a
    second (a survivor's end and the failure should reach the same scrape)."""
    from traceml_otel.emit.first_failure import READ_EVERY_S, FirstFailureWatch
    from traceml_otel.wire.manifest import Manifest, write_manifest

    manifest = Manifest(run_id="r", world_size=2)
    write_manifest(tmp_path, manifest)
    watch = FirstFailureWatch(tmp_path)
    assert watch() is None
    write_manifest(tmp_path, replace(manifest, first_failure_rank=1, first_failure="SIGKILL"))
    assert watch() is None  # read again only after READ_EVERY_S
    time.sleep(READ_EVERY_S + 0.05)
    assert watch() == (1, "SIGKILL")
    assert READ_EVERY_S <= 0.25


def test_a_bad_end_under_traceml_run_reaches_a_scrape_with_its_first_failure() -> None:
    """A survivor's end (an exception, a SIGTERM) reads as running until the launcher's first failure is
    read, for at most FIRST_FAILURE_WAIT_S; a clean end and a direct launch's end show at once."""
    from traceml_otel.emit.live_state import FIRST_FAILURE_WAIT_S, LiveState

    found: list[tuple[int, str]] = []
    state = LiveState(LABELS, lambda: 0)
    state.first_failure = lambda: found[0] if found and state.ended else None
    state.first_failure_expected = True
    state.exit, state.ended, state.ended_at = exit_of("exception RuntimeError"), 1, time.monotonic()
    assert state.end_for_scrape() == (None, 0, None)
    assert state.end_hold_s == FIRST_FAILURE_WAIT_S
    found.append((1, "SIGKILL"))
    assert state.end_for_scrape() == (("exception", "RuntimeError"), 1, (1, "SIGKILL"))
    found.clear()
    state.ended_at = time.monotonic() - FIRST_FAILURE_WAIT_S  # none came in time: the end shows anyway
    assert state.end_for_scrape() == (("exception", "RuntimeError"), 1, None)
    state.ended_at = time.monotonic()
    state.exit = exit_of("ok")
    assert state.end_for_scrape() == (("clean", ""), 1, None) and state.end_hold_s == 0
    state.exit, state.first_failure_expected = exit_of("SIGTERM"), False  # a direct launch: no launcher
    assert state.end_for_scrape() == (("signal", "SIGTERM"), 1, None) and state.end_hold_s == 0
