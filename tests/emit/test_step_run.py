"""A templated run's steps read a column at a time (emit/step_run.py) give the step metrics and the live
time account exactly what their records give, on thousands of random rows of many shapes."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from tests.emit.test_step_lines import ANCHOR, RANK, _record, _row
from tests.emit.test_step_protobuf import ENCODER
from traceml_otel import contract as c
from traceml_otel.emit.spans import StepSpanBuilder
from traceml_otel.emit.step_lines import StepLines
from traceml_otel.emit.step_metrics import RankLabels, StepMetrics
from traceml_otel.emit.step_protobuf import EncodedStep
from traceml_otel.emit.step_run import StepRun, resolve_records
from traceml_otel.emit.time_metrics import LiveTimeAccount
from traceml_otel.wire.step_row import decode_step

LABELS = RankLabels(run_id="r", rank=3, local_rank=1, host="h", version="9")


def _rows(count: int, seed: int, shapes: int = 40) -> list[list[Any]]:
    values = random.Random(seed)
    return [_row(_record(step, random.Random(step // 29 % shapes), values)) for step in range(count)]


def _batches(rows: list[list[Any]], batch: int) -> list[tuple[list[Any], list[Any]]]:
    """Each batch's (records, built) as the emitter hands them to export and the metrics."""
    builder = StepSpanBuilder(RANK)
    builder._random.seed(1)
    lines = StepLines(builder)
    lines.otlp = ENCODER
    out = []
    for first in range(0, len(rows), batch):
        encoded = lines.encode(rows[first:first + batch], ANCHOR, keep_spans=True)
        out.append((encoded.records, encoded.built))
    return out


def test_steps_left_to_their_run_decode_to_their_records() -> None:
    rows = _rows(3000, seed=2)
    expected = [decode_step(copy.deepcopy(row), ANCHOR) for row in rows]
    batches = _batches(rows, 64)
    left = sum(record is None for records, _ in batches for record in records)
    assert left > 0.8 * len(rows)  # most steps of a steady job are templated
    resolved = [record for records, built in batches for record in resolve_records(records, built)]
    assert resolved == expected
    for records, built in batches:
        for record, step in zip(records, built, strict=True):
            assert (record is None) == (type(step) is EncodedStep and step.run is not None)


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every metric's points as comparable values: no collection times; exemplars by value and ids."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    fields = {k: v for k, v in vars(point).items()
                              if k not in ("start_time_unix_nano", "time_unix_nano", "exemplars")}
                    exemplars = sorted((e.value, e.trace_id, e.span_id, str(e.filtered_attributes))
                                       for e in getattr(point, "exemplars", None) or ())
                    out.setdefault(metric.name, []).append((sorted(fields.items(), key=str), exemplars))
    return {name: sorted(points, key=str) for name, points in out.items()}


@pytest.mark.parametrize("batch", [64, 256, 7])
def test_the_metrics_from_a_run_are_the_metrics_from_its_records(batch: int) -> None:
    """Histograms (counts, sums to the bit, min, max, each bucket's exemplar), counters, the last
    input wait and step end, the CUDA peaks and the time account's counters: equal both ways."""
    rows = _rows(3000, seed=5)
    batches = _batches(rows, batch)
    sampled = random.Random(9)
    exemplars = [[sampled.random() < 0.7 for _ in records] for records, _ in batches]
    readers = []
    for by_run in (True, False):
        reader = InMemoryMetricReader()
        metrics = StepMetrics(Resource.create({}), LABELS, None, metric_reader=reader)
        for (records, built), chosen in zip(batches, exemplars, strict=True):
            if not by_run:
                records = resolve_records(records, built)
            metrics.record_batch(zip(records, built, chosen, strict=True))
        readers.append((reader, metrics))
    (run_reader, run_metrics), (record_reader, record_metrics) = readers
    by_run, by_record = _points(run_reader), _points(record_reader)
    time_counter = c.METRIC_TIME  # the account's seconds: float sums grouped by batch part, see below
    assert {k: v for k, v in by_run.items() if k != time_counter} == {
        k: v for k, v in by_record.items() if k != time_counter}
    assert (run_metrics.state.last_wait_s, run_metrics.state.last_step_end_s) == (
        record_metrics.state.last_wait_s, record_metrics.state.last_step_end_s)
    _same_account(run_metrics.state.time.account, record_metrics.state.time.account)


def _same_account(a: LiveTimeAccount, b: LiveTimeAccount) -> None:
    """The same steps, last end and FLOPs; the same seconds per category but for the last bits: each
    part of a batch adds its own sum to a category's float (a run's part, then the steps around it),
    as batches of other sizes would."""
    assert (a._steps, a._last_end, a.flops, a.flops_steps) == (b._steps, b._last_end, b.flops, b.flops_steps)
    assert a._seconds.keys() == b._seconds.keys()
    for name, seconds in a._seconds.items():
        assert seconds == pytest.approx(b._seconds[name], rel=1e-12, abs=1e-12), name


FLOPS = [
    {"declared_sum": 7e12, "declared_steps": 3},
    {"measured": 1.25e9, "measured_step": 777},
    {"per_token": 6.0e6},
    {"per_sample": 3.3e8},
    {"per_token": 6.0e6, "per_sample": 3.3e8, "measured_step": 1234},
    {},
]


@pytest.mark.parametrize("flops", FLOPS)
def test_the_time_account_counts_a_run_as_its_records(flops: dict[str, Any]) -> None:
    """Seconds by category, the last end and the model FLOPs (declared, measured, per token or sample,
    the measured step left out), a run's part at a time against the records of the same steps."""
    rows = _rows(2000, seed=11, shapes=6)
    accounts = (LiveTimeAccount(), LiveTimeAccount())
    time_record = SimpleNamespace(resumed_from=None, earlier_progress=0, flops=SimpleNamespace(**{
        "declared_sum": None, "declared_steps": 0, "measured": None, "measured_step": None,
        "per_token": None, "per_sample": None, **flops}))
    runs = 0
    for index, (records, built) in enumerate(_batches(rows, 100)):
        decoded = resolve_records(records, built)
        for account in accounts:
            account.record = time_record if index else None  # (the first steps: before the record)
        accounts[1].add_steps(decoded)
        first = 0
        while first < len(records):  # the run path: each run's part, the other steps by their records
            step = built[first]
            if records[first] is None:
                run: StepRun = step.run
                stop = first
                while stop < len(records) and records[stop] is None and built[stop].run is run:
                    stop += 1
                accounts[0].add_run(run, step.index, step.index + stop - first)
                runs += 1
            else:
                stop = first + 1
                accounts[0].add_steps(decoded[first:stop])
            first = stop
    assert runs > 10
    a, b = accounts
    _same_account(a, b)
    assert (a.flops_steps > 0) == bool(flops)
