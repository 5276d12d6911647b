"""DDP steps (steps with collective calls) on the templated paths: the local copy's JSON, the step
table's CSV and OTLP protobuf are the reference path's bytes, on thousands of random rows."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from tests.emit.test_step_lines import ANCHOR, MS, _fast, _record, _reference, _row, emit_three_ways
from tests.emit.test_step_protobuf import ENCODER
from tests.emit.test_step_protobuf import _fast as _fast_protobuf
from tests.emit.test_step_protobuf import _reference as _reference_spans
from traceml_otel.emit.span_budget import Kept, KeptEncoder
from traceml_otel.emit.step_protobuf import EncodedStep, fill_kept

KINDS = (("all_reduce", "ddp", False), ("all_reduce", "ddp", False), ("broadcast", "api", True),
         ("all_gather", "api", False), ("all_reduce", "api", True), ('odd "k",%', "ddp", False))


def _ddp_row(step: int, profile: random.Random, values: random.Random) -> list[object]:
    """A random step (test_step_lines' shapes) with the profile's collective calls: how many, their
    kinds, sources and which of their times are known; their times from ``values`` (inside backward
    mostly, sometimes in another phase, before the step or after it)."""
    record = _record(step, profile, values)
    row = _row(record)
    calls = profile.choice([1, 2, 2, 3, 5])
    kinds = [profile.choice(KINDS) for _ in range(calls)]
    unknown_end = profile.random() < 0.15
    on_gpu = record.gpu_duration_ns is not None and profile.random() < 0.7
    phases = [p for p in record.phases if p.phase == "backward"] or list(record.phases)
    collectives = []
    for kind, source, blocking in kinds:
        where = values.random()
        if phases and where < 0.8:
            phase = values.choice(phases)
            start = values.randint(phase.start_ns, max(phase.start_ns, phase.end_ns - 1))
        elif where < 0.9:
            start = record.start_ns - values.randint(1, 10**6)  # before the step
        else:
            start = record.end_ns + values.randint(0, 10**6)  # after it
        end = None if unknown_end and values.random() < 0.5 else start + values.randint(0, 200_000)
        offset = start - record.start_ns if on_gpu else None
        gpu = values.randint(0, 300_000) if on_gpu and values.random() < 0.95 else None
        collectives.append([kind, source, start - ANCHOR, None if end is None else end - ANCHOR,
                            values.choice([25 << 20, values.randint(0, 1 << 40)]), blocking, offset, gpu])
    row[15] = collectives
    return row


def _rows(count: int, seed: int, profiles: int, run: int = 1, plain: float = 0.1) -> list[list[object]]:
    values = random.Random(seed)
    rows = []
    for step in range(count):
        profile = random.Random(step // run % profiles)
        if profile.random() < plain:  # a step without collectives between DDP steps
            rows.append(_row(_record(step, profile, values)))
        else:
            rows.append(_ddp_row(step, profile, values))
    return rows


@pytest.mark.parametrize(("batch", "run"), [(64, 1), (64, 40), (7, 13)])
def test_ddp_steps_encode_as_the_reference(batch: int, run: int) -> None:
    """JSON and CSV: every step's text is the reference path's, with calls outside the step, unknown
    ends and device times, several kinds per step and shapes changing inside a batch."""
    rows = _rows(3000, seed=run, profiles=30, run=run)
    fast_spans, fast_lines, lines = _fast(rows, seed=5, batch=batch)
    reference_spans, reference_lines = _reference(rows, seed=5)
    assert fast_spans == reference_spans
    assert fast_lines == reference_lines
    assert lines.reference_steps < len(rows) // 3  # most steps took the templates
    assert fast_lines.count("all_reduce") == 0  # (the table holds totals, not kinds)
    assert sum(1 for row in rows if row[15]) > 2000


def test_steady_ddp_steps_take_the_templates() -> None:
    """A DDP rank's steady state (two buckets in backward each step, as the benchmark's): all but the
    first step of each shape are templated, and the text is the reference's."""
    rows = _rows(2000, seed=3, profiles=1, run=1, plain=0.0)
    fast_spans, fast_lines, lines = _fast(rows, seed=2, batch=64)
    assert (fast_spans, fast_lines) == _reference(rows, seed=2)
    assert lines.reference_steps < 60


@pytest.mark.parametrize("batch", [64, 7])
def test_ddp_steps_protobuf_is_the_encoders_bytes(batch: int) -> None:
    """OTLP: a templated DDP step's spans are the encoder's bytes for the reference spans (collective
    spans included), and it carries the reference's collective spans for the metrics."""
    rows = _rows(3000, seed=11 + batch, profiles=30, run=20)
    fast, lines = _fast_protobuf(rows, seed=4, batch=batch)
    reference = _reference_spans(rows, seed=4)
    templated = with_collectives = 0
    for got, want in zip(fast, reference, strict=True):
        assert (got.trace_id, got.span_id, got.count) == (want.trace_id, want.span_id, want.count)
        assert got.collectives == want.collectives
        if type(got) is EncodedStep:
            templated += 1
            with_collectives += bool(want.collectives)
            assert list(got.encoded) == [ENCODER.encode(span) for span in want.all()]
        else:
            assert got.all() == want.all()
    assert templated > 2000 and with_collectives > 1500
    assert lines.reference_steps < 1000
    kept_encoder = KeptEncoder(ENCODER)  # the span budget's tracestate spliced into the encoded bytes
    kept = Kept("ot=th:e666;rv:" + "f" * 14, "e666")
    for got, want in list(zip(fast, reference, strict=True))[:400]:
        if type(got) is EncodedStep:
            assert kept_encoder(got, kept) == kept_encoder(want.all(), kept)


def test_ddp_steps_under_the_span_budget_fill_the_encoders_bytes() -> None:
    """With the span budget on, a templated DDP step's protobuf waits for the decision and is then the
    encoder's bytes."""
    rows = _rows(640, seed=21, profiles=4, run=64, plain=0.0)
    reference = _reference_spans(rows, seed=6)
    from tests.emit.test_step_lines import RANK
    from traceml_otel.emit.spans import StepSpanBuilder
    from traceml_otel.emit.step_lines import StepLines

    builder = StepSpanBuilder(RANK)
    builder._random.seed(6)
    lines = StepLines(builder)
    lines.otlp = ENCODER
    lines.defer_protobuf = True
    built = []
    for first in range(0, len(rows), 64):
        encoded = lines.encode(rows[first:first + 64], ANCHOR, keep_spans=True).built
        fill_kept(encoded, None)
        built += encoded
    checked = 0
    for got, want in zip(built, reference, strict=True):
        if type(got) is EncodedStep:
            assert list(got.encoded) == [ENCODER.encode(span) for span in want.all()]
            checked += 1
    assert checked > 500


def test_float_columns_written_by_orjson_are_the_repr_text() -> None:
    """The communication sums' texts: ``repr``'s, digit for digit, zeros, tiny, huge and non-finite
    values included (those send the column to ``repr``)."""
    from traceml_otel.emit.step_columns import float_texts

    draw = random.Random(23)
    values = [draw.randint(0, 10**13) * 1e-9 for _ in range(100_000)]
    values += [0.0, -0.0] * 5000 + [draw.randint(-10**6, 10**6) * 1e-9 for _ in range(20_000)]
    values += [draw.randint(1, 2**70) * 1e-9 for _ in range(20_000)]
    draw.shuffle(values)
    for first in range(0, len(values), 500):
        column = values[first:first + 500]
        assert float_texts(column) == [repr(value) for value in column]
        assert float_texts(column).seconds == column
    for odd in ([0.0, 0.0], [float("nan"), 1.0], [1.0, float("inf")], [1e-5, 1.0], [1e16, 1.0]):
        assert float_texts(odd) == [repr(value) for value in odd]


@pytest.mark.parametrize("buckets", [False, True])
def test_the_default_emitter_writes_a_ddp_ranks_files_as_the_reference_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buckets: bool) -> None:
    """A DDP rank's emitter (local copy only, the default): the templates write the same local copy
    and step table as every step forced onto span objects, and as the emitter keeping spans; with
    ``buckets``, a steady DDP rank's rows (most steps a column at a time: emit/bucket_runs.py)."""
    rows = (_bucket_rows(700, seed=31, run=90) if buckets
            else _rows(700, seed=31, profiles=6, run=90, plain=0.05))
    outputs = {}
    for name, (emitter, files) in emit_three_ways(tmp_path, rows, monkeypatch).items():
        outputs[name] = (files, emitter.stats.spans_local, emitter.table.rows if emitter.table else None)
        if name == "reference":
            assert emitter.lines.reference_steps == len(rows)
        else:
            assert emitter.lines.reference_steps < len(rows) // 4
            assert emitter.lines.bucket_steps > (300 if buckets else -1)
    assert outputs["fast"] == outputs["reference"] == outputs["export"]
    assert b"traceml.collective" in outputs["fast"][0][0]


def test_ddp_rows_the_templates_cannot_hold_take_the_reference_path() -> None:
    """Odd calls inside runs of a steady DDP shape (another kind, a float time, float bytes, an int
    ``blocking``, a call fewer or more, a device offset, an unknown end, none, a call as a tuple):
    the text is still the reference's."""
    rows = _rows(400, seed=41, profiles=1, plain=0.0)

    def changed(index: int, change: object) -> None:
        calls = [list(call) for call in rows[index][15]]  # type: ignore[attr-defined]
        rows[index] = list(rows[index])
        rows[index][15] = change(calls) if callable(change) else change

    def set_slot(slot: int, value: object) -> object:
        def change(calls: list[list[object]]) -> list[list[object]]:
            calls[0][slot] = value
            return calls
        return change

    for index, change in [
        (70, set_slot(0, "reduce_scatter")), (71, set_slot(2, 1.5e9)), (72, set_slot(4, 2.5)),
        (73, set_slot(5, 1)), (74, lambda calls: calls[:-1]), (75, lambda calls: [*calls, list(calls[0])]),
        (76, set_slot(6, 5)), (77, set_slot(3, None)), (140, []),
        (141, lambda calls: [tuple(calls[0]), *calls[1:]]),
    ]:
        changed(index, change)
    for batch in (64, 5):
        fast_spans, fast_lines, lines = _fast(rows, seed=7, batch=batch)
        assert (fast_spans, fast_lines) == _reference(rows, seed=7)
        assert lines.reference_steps < 60


BUCKET_KINDS = ("all_reduce", "all_reduce", "reduce_scatter", 'odd "k",%')


def _bucket_row(step: int, profile: random.Random, values: random.Random) -> list[object]:
    """A random step whose calls are mostly a steady DDP rank's (``ddp`` buckets of one kind handed
    over in one phase call: emit/bucket_runs.py's case), with the profile's phase call, bucket count,
    kind and device times; sometimes a bucket elsewhere (another phase call, before or after the
    step), an unknown end or device time, a late completion past the next step's start or ties."""
    record = _record(step, profile, values)
    if record.phases and profile.random() < 0.2:  # a first call overlapping the later ones (or not)
        first = record.phases[0]
        end = first.end_ns + values.choice([0, values.randint(0, 4 * MS)])
        phases = (dataclasses.replace(first, end_ns=end), *record.phases[1:])
        record = dataclasses.replace(record, phases=phases)
    row = _row(record)
    calls = profile.choice([1, 2, 2, 3, 4])
    kind = profile.choice(BUCKET_KINDS)
    device = profile.random() < 0.5  # every call's device times known (else none)
    phases = [p for p in record.phases if p.phase in ("forward", "backward", "optimizer")]
    home = profile.choice(phases) if phases and profile.random() < 0.3 else None
    home = home or next((p for p in phases if p.phase == "backward"), phases[0] if phases else None)
    ties = profile.random() < 0.2
    collectives = []
    for _ in range(calls):
        odd = values.random()
        if home is not None and odd > 0.04:
            start = values.randint(home.start_ns, max(home.start_ns, home.end_ns - 1))
        elif phases and odd > 0.02:
            other = values.choice(phases)
            start = values.randint(other.start_ns, max(other.start_ns, other.end_ns - 1))
        else:
            start = record.start_ns - values.randint(1, 10**6)  # before the step
            if odd < 0.01:
                start = record.end_ns + values.randint(0, 10**6)  # after it
        end = start + (values.randint(0, 3) if ties else values.randint(0, 300_000))
        if values.random() < 0.03:
            end += 30 * 10**6  # past the next steps' starts: their work counts from this exit
        offset = start - record.start_ns + values.randint(0, 5000) if device else None
        gpu = values.randint(0, 300_000) if device else None
        if values.random() < 0.02:
            end, offset, gpu = values.choice([(None, offset, gpu), (end, None, gpu), (end, offset, None)])
        collectives.append([kind, "ddp", start - ANCHOR, None if end is None else end - ANCHOR,
                            values.choice([25 << 20, values.randint(0, 1 << 40)]), False, offset, gpu])
    row[15] = collectives
    return row


def _bucket_rows(count: int, seed: int, run: int) -> list[list[object]]:
    values = random.Random(seed)
    return [_bucket_row(step, random.Random(step // run % 25), values) for step in range(count)]


@pytest.mark.parametrize(("batch", "run"), [(64, 64), (64, 200), (7, 30)])
def test_steady_ddp_runs_a_column_at_a_time_encode_as_the_reference(batch: int, run: int) -> None:
    """A steady DDP rank's runs (emit/bucket_runs.py: the values a column at a time): JSON and CSV are
    the reference path's, and most steps took the columnar path."""
    rows = _bucket_rows(3000, seed=run + batch, run=run)
    fast_spans, fast_lines, lines = _fast(rows, seed=8, batch=batch)
    assert (fast_spans, fast_lines) == _reference(rows, seed=8)
    assert lines.bucket_steps > 1000


@pytest.mark.parametrize("batch", [64, 9])
def test_steady_ddp_runs_a_column_at_a_time_protobuf_is_the_encoders_bytes(batch: int) -> None:
    """OTLP: the columnar path's steps carry the reference's collective spans (the metrics read them)
    and their protobuf is the encoder's bytes for the reference spans."""
    rows = _bucket_rows(3000, seed=50 + batch, run=100)
    fast, lines = _fast_protobuf(rows, seed=9, batch=batch)
    checked = 0
    for got, want in zip(fast, _reference_spans(rows, seed=9), strict=True):
        assert (got.trace_id, got.span_id, got.count, got.collectives) == (
            want.trace_id, want.span_id, want.count, want.collectives)
        if type(got) is EncodedStep:
            assert list(got.encoded) == [ENCODER.encode(span) for span in want.all()]
            checked += 1
        else:
            assert got.all() == want.all()
    assert lines.bucket_steps > 1000 and checked > 2000


@pytest.mark.parametrize("decoded", [True, False])
def test_bucket_parts_are_step_parts_value_for_value(decoded: bool) -> None:
    """emit/bucket_runs.py's parts are the per-step functions' (values, key order and types) on every
    segment it takes, with the previous exit carried across segments and runs; from the decoded
    records (OTLP, span objects) and straight from the rows (the local outputs alone)."""
    from traceml_otel.emit.bucket_runs import bucket_segments
    from traceml_otel.emit.step_collectives import step_parts
    from traceml_otel.emit.step_shapes import runs
    from traceml_otel.wire.step_row import decode_step

    def typed(values: object) -> object:
        if isinstance(values, dict):
            return [(key, typed(value)) for key, value in values.items()]
        if isinstance(values, list | tuple):
            return [typed(value) for value in values]
        return (type(values), values)

    rows = _bucket_rows(4000, seed=77, run=40)
    previous: list[int | None] = [None]
    taken = 0
    for first in range(0, len(rows), 40):
        for key, run, _ in runs(rows[first:first + 40]):
            assert key is not None
            decode = decode_step if decoded else None
            for segment, _, got in bucket_segments(key, run, ANCHOR, decode, lambda: previous[0]):
                for k, row in enumerate(segment):
                    record = decode_step(row, ANCHOR)
                    want = step_parts(record, previous[0])
                    assert want is not None
                    previous[0] = want.last_exit_ns
                    if got is None:
                        continue
                    one = got[k]
                    taken += 1
                    assert typed([one.step, one.phases, one.groups]) == typed(
                        [want.step, want.phases, want.groups])
                    assert (one.record, one.previous_exit_ns, one.last_exit_ns) == (
                        record if decoded else None, want.previous_exit_ns, want.last_exit_ns)
    assert taken > 1500
