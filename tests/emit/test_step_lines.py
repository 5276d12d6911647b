"""The local copy's and the step table's fast path gives the reference path's text, byte for byte."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import orjson
import pytest

from traceml_otel import contract as c
from traceml_otel.emit import step_columns, step_lines
from traceml_otel.emit.emitter import Emitter
from traceml_otel.emit.local_copy import span_json
from traceml_otel.emit.spans import RankInfo, StepSpanBuilder, StepSpans
from traceml_otel.emit.step_lines import StepLines
from traceml_otel.emit.step_run import resolve_records
from traceml_otel.emit.step_table import csv_line, step_row
from traceml_otel.step_records import PhaseTiming, StepRecord
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.step_row import decode_step

MS = 1_000_000
EPOCH = 1_700_000_000_000_000_000
ANCHOR = 1_699_999_000_000_000_000  # the trainer's epoch - perf_counter offset
# Strings that need escaping in JSON, in CSV and in a % template.
RANK = RankInfo(run_id='run "%d" ü,1', rank=3, local_rank=1, world_size=8, node_rank=0, host="h,%s\n",
                cpus=16)
PHASE_SETS = (
    ("forward", "backward", "optimizer"),
    ("h2d", "forward", "backward", "optimizer"),
    ("forward", "backward", "forward", "backward", "optimizer"),  # gradient accumulation
    ("custom%phase",),
    (),
)


def _record(step: int, profile: random.Random, values: random.Random) -> StepRecord:
    """A step whose shape comes from ``profile`` and whose numbers come from ``values``."""
    start = EPOCH + step * 10 * MS
    on_gpu = profile.random() < 0.4
    phases, t = [], start
    for name in profile.choice(PHASE_SETS):
        length = values.randint(0, 3 * MS)
        gpu = None if not on_gpu or profile.random() < 0.2 else values.randint(1, 3 * MS)
        offset = None if gpu is None or profile.random() < 0.2 else t - start + values.randint(0, 1000)
        nbytes = profile.choice([None, 4096 * values.randint(1, 9)]) if name == "h2d" else None
        call = sum(p.phase == name for p in phases)
        phases.append(PhaseTiming(name, call, t, t + length, offset, gpu, nbytes))
        t += length

    def some(value: object) -> object:
        return profile.choice([None, value])

    return StepRecord(
        step, start, t + values.randint(0, MS), tuple(phases),
        gpu_duration_ns=values.randint(1, 20 * MS) if on_gpu else None,
        input_wait_ns=some(values.randint(0, 5 * MS)), input_wait_gpu_ns=some(values.randint(0, MS)),
        input_fetches=profile.choice([0, 1, 2]), prefetch_h2d_ns=some(values.randint(0, MS)),
        optimizer_steps=profile.choice([0, 1]), parallelism=profile.choice(["none", "ddp", "fsdp"]),
        peak_allocated_bytes=some(values.randint(0, 1 << 34)),
        peak_reserved_bytes=some(values.randint(0, 1 << 35)),
        device_total_bytes=some(80 << 30), samples=some(values.randint(1, 512)),
        tokens=some(values.randint(1, 1 << 20)), source=profile.choice([None, "trace_step", 'odd "src",%']),
        between_steps_ns=some(values.randint(0, MS)),
    )


def _reference(rows: list[list[object]], seed: int) -> tuple[str, str]:
    """The reference path: decode, build spans, encode them and the table row one by one. Returns
    every step's spans, comma-joined, and every CSV line."""
    builder = StepSpanBuilder(RANK)
    builder._random.seed(seed)
    spans, lines = [], []
    for row in rows:
        built = builder.build(decode_step(row, ANCHOR))
        spans.append(",".join(span_json(span) for span in built.all()))
        lines.append(csv_line(step_row(built)))
    return ",".join(spans), "".join(lines)


def _fast(rows: list[list[object]], seed: int, batch: int = 64) -> tuple[str, str, StepLines]:
    """The fast path, and (a second builder, the same seed) the span objects it keeps for export:
    the same text from the same ids."""
    spans, texts = [], []
    outputs = []
    for keep_spans in (False, True):
        builder = StepSpanBuilder(RANK)
        builder._random.seed(seed)
        lines = StepLines(builder)
        spans, texts = [], []
        for first in range(0, len(rows), batch):
            encoded = lines.encode(rows[first:first + batch], ANCHOR, keep_spans=keep_spans)
            assert encoded.spans == sum(text.count('"traceId"') for text in encoded.spans_json)
            assert encoded.steps == len(rows[first:first + batch]) == "".join(encoded.rows).count("\n")
            if keep_spans:  # what OTLP export and the metrics get is what the local copy says
                text = ",".join(encoded.spans_json)
                roots = [(int(span["traceId"], 16), int(span["spanId"], 16), span["attributes"][2])
                         for span in json.loads("[" + text + "]") if "parentSpanId" not in span]
                assert [(built.trace_id, built.span_id) for built in encoded.built] == [r[:2] for r in roots]
                records = resolve_records(encoded.records, encoded.built)  # (a run's: decoded)
                assert [record.step for record in records] == [int(r[2]["value"]["intValue"]) for r in roots]
                assert sum(built.count for built in encoded.built) == encoded.spans
                for built in encoded.built:  # steps built as span objects: the text's own spans
                    if isinstance(built, StepSpans):
                        assert ",".join(span_json(span) for span in built.all()) in text
            else:
                assert encoded.built == [] and encoded.records == []
            spans += encoded.spans_json
            texts += encoded.rows
        outputs.append((",".join(spans), "".join(texts)))
    assert outputs[0] == outputs[1]
    return *outputs[1], lines


def test_random_steps_of_many_shapes_encode_as_the_reference() -> None:
    values = random.Random(5)
    rows = [_row(_record(step, random.Random(step % 40), values)) for step in range(4000)]
    fast_spans, fast_lines, lines = _fast(rows, seed=11)
    reference_spans, reference_lines = _reference(rows, seed=11)
    assert fast_spans == reference_spans
    assert fast_lines == reference_lines
    assert lines.reference_steps <= 41  # the first step, then the first of each of 40 shapes
    assert len(json.loads("[" + fast_spans + "]")) == sum(1 + len(row[14]) for row in rows)  # valid JSON


@pytest.mark.parametrize("batch", [256, 64, 7])
def test_runs_of_one_shape_encode_as_the_reference(batch: int) -> None:
    """A trainer's batch is usually one shape: each run is encoded a column at a time (GPU timelines,
    gradient accumulation's summed table columns, shapes changing inside a batch included)."""
    values = random.Random(6)
    rows = [_row(_record(step, random.Random(step // 37 % 12), values)) for step in range(2000)]
    fast_spans, fast_lines, lines = _fast(rows, seed=9, batch=batch)
    assert (fast_spans, fast_lines) == _reference(rows, seed=9)
    assert lines.reference_steps <= 13


def test_rows_as_the_training_thread_sends_them_unnumbered_encode_as_numbered_rows() -> None:
    """The trainer leaves each phase call's number to the emitter: the text is the same as from rows
    that carry them (gradient accumulation's repeated phases included), on both paths."""
    values = random.Random(8)
    rows = [_row(_record(step, random.Random(step // 20 % 10), values)) for step in range(600)]
    unnumbered = json.loads(json.dumps(rows))
    for row in unnumbered:
        for phase in row[14]:
            phase[1] = None
    assert any(len({p[0] for p in row[14]}) < len(row[14]) for row in rows)  # some phase runs twice
    assert _fast(unnumbered, seed=4)[:2] == _fast(rows, seed=4)[:2] == _reference(rows, seed=4)


def test_rows_the_templates_cannot_hold_take_the_reference_path() -> None:
    values = random.Random(2)
    base = [_row(_record(step, random.Random(13), values)) for step in range(60)]  # phases, GPU, source

    def changed(index: int, slot: int, value: object) -> list[object]:
        row = list(base[index])
        row[slot] = value
        return row

    start = base[5][1]
    odd = [
        changed(5, 15, [["all_reduce", "ddp", start + 10, start + 99, 1024, False, None, None]]),
        changed(6, 13, "ValueError"),  # an exception left the step
        changed(7, 18, [2, True, False, 2, 32, "TensorDataset"]),  # a new DataLoader
        changed(8, 16, True),  # a bool where an int belongs
        changed(9, 4, 2.5e6),  # a float time, then one that is no JSON number
        changed(19, 4, float("inf")),
        changed(10, 9, None),  # no parallelism
        changed(11, 20, -5),  # a negative time between steps: decoded as unknown
        changed(12, 20, True),
        changed(13, 19, 7),  # a source that is not text: decoded as none
        changed(14, 18, []),  # an empty loader slot: no loader
        base[15][:15],  # the first layout (no appended slots)
        [*base[16], "a slot from a newer trainer"],
        changed(17, 14, [[*phase, 1] for phase in base[17][14]]),  # longer phase rows
        changed(18, 14, [phase[:7] for phase in base[18][14]]),
        changed(20, 14, [[*base[20][14][0], 7]]),  # one phase row, one slot longer
    ]
    rows = base[:5] + odd + base[21:] + odd  # each odd row twice: a shape seen before, too
    fast_spans, fast_lines, lines = _fast(rows, seed=3, batch=7)
    assert (fast_spans, fast_lines) == _reference(rows, seed=3)
    assert lines.reference_steps >= 1 + 2 * 9


def test_past_the_shape_limit_rows_still_encode_as_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_lines, "SHAPE_LIMIT", 3)
    values = random.Random(8)
    rows = [_row(_record(step, random.Random(step % 10), values)) for step in range(200)]
    fast_spans, fast_lines, lines = _fast(rows, seed=4)
    assert (fast_spans, fast_lines) == _reference(rows, seed=4)
    assert lines.reference_steps > 100


def _emitter(run_dir: Path) -> Emitter:
    hello = Hello(run_id=RANK.run_id, rank=RANK.rank, local_rank=RANK.local_rank, world_size=RANK.world_size,
                  node_rank=RANK.node_rank, host=RANK.host, pid=1, anchor_ns=ANCHOR, shutdown_timeout_s=1.0,
                  run_dir=str(run_dir), cpus=RANK.cpus)
    emitter = Emitter(hello)
    emitter.builder._random.seed(21)
    return emitter


def emit_three_ways(tmp_path: Path, rows: list, monkeypatch: pytest.MonkeyPatch
                    ) -> dict[str, tuple[Emitter, list[bytes]]]:
    """``rows`` through a whole emitter three ways, each in its own folder: ``fast`` (the default,
    local copy only), ``reference`` (no templates: every step through span objects) and ``export``
    (span objects kept, as with an OTLP endpoint); each way's finished emitter and its local copy's
    and step table's bytes."""
    done = {}
    for name in ("fast", "reference", "export"):
        emitter = _emitter(tmp_path / name)
        with monkeypatch.context() as patch:
            if name == "reference":
                patch.setattr(step_lines, "SHAPE_LIMIT", 0)
            if name == "export":
                patch.setattr(Emitter, "_local_outputs_only", property(lambda self: False))
            for first in range(0, len(rows), 64):
                emitter.handle_steps(rows[first:first + 64])
                while emitter.has_export_work:
                    emitter.export_next()
            emitter.finish("ok", 0, True, steps_traced=len(rows))
        assert emitter.stats.steps_local == len(rows) and emitter.stats.local_copy_complete
        done[name] = (emitter, [(tmp_path / name / f"rank-3.{kind}").read_bytes()
                                for kind in ("traces.jsonl", "steps.csv")])
    return done


def test_the_default_emitter_writes_the_files_the_reference_path_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local copy only (the default): the fast path; forced onto span objects, the same bytes."""
    values = random.Random(13)
    rows = [_row(_record(step, random.Random(step % 6 if step < 350 else step // 90), values))
            for step in range(700)]  # a shape per step, then runs of one shape
    assert _emitter(tmp_path / "check")._local_outputs_only
    outputs = {}
    for name, (emitter, files) in emit_three_ways(tmp_path, rows, monkeypatch).items():
        stats = emitter.stats
        table_rows = emitter.table.rows if emitter.table else None
        assert table_rows == len(rows)
        outputs[name] = (files, stats.spans_local, stats.metrics_skipped_steps, table_rows)
        if name != "reference":
            assert emitter.lines.reference_steps <= 12
        else:
            assert emitter.lines.reference_steps == len(rows)
    assert outputs["fast"] == outputs["reference"] == outputs["export"]


def _row(record: StepRecord) -> list[object]:
    """``record`` as the step row the trainer sends (its times on the trainer's clock, ``ANCHOR`` off)."""
    phases = [[p.phase, p.call, p.start_ns - ANCHOR, p.end_ns - ANCHOR, p.gpu_offset_ns, p.gpu_duration_ns,
               p.nbytes] for p in record.phases]
    return [record.step, record.start_ns - ANCHOR, record.end_ns - ANCHOR, record.gpu_duration_ns,
            record.input_wait_ns, record.input_wait_gpu_ns, record.input_fetches, record.prefetch_h2d_ns,
            record.optimizer_steps, record.parallelism, record.peak_allocated_bytes,
            record.peak_reserved_bytes,
            record.device_total_bytes, record.exception_type, phases, [], record.samples, record.tokens, None,
            record.source, record.between_steps_ns, record.input_wait_in_step_ns, record.skipped_updates]


def test_durations_written_by_orjson_are_the_repr_text() -> None:
    """A column of durations all in 1e-4..1e16 seconds is written by orjson in one call; the text must
    be ``repr``'s (what ``json.dumps`` writes), digit for digit. Below 1e-4 ``repr`` is used."""
    draw = random.Random(17)
    nanoseconds = [draw.randint(-10**12, 10**13) for _ in range(200_000)]
    nanoseconds += [draw.randint(0, 2**63) for _ in range(50_000)]
    nanoseconds += [draw.randint(-10**5, 10**5) for _ in range(50_000)]  # below 1e-4 s: exponents
    nanoseconds += [draw.choice([-1, 1]) * draw.randint(1, 10**k) for k in range(1, 10) for _ in range(2_000)]
    nanoseconds += [sign * (10**k + d) for k in range(0, 19) for d in (-1, 0, 1) for sign in (-1, 1)]
    nanoseconds += [0, 1, -1, 10_000, 99_999, 100_000, 100_001]
    draw.shuffle(nanoseconds)
    for first in range(0, len(nanoseconds), 1000):
        column = nanoseconds[first:first + 1000]
        assert step_columns.seconds_text(column) == [repr(ns * 1e-9) for ns in column]
    large = [ns for ns in nanoseconds if abs(ns) >= 100_000]
    assert step_columns.seconds_text(large) == [repr(ns * 1e-9) for ns in large]
    by_orjson = orjson.dumps([ns * 1e-9 for ns in large])[1:-1].decode().split(",")
    assert step_columns.seconds_text(large) == by_orjson  # the orjson path, all of it


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 1024, 1027])
def test_span_ids_drawn_at_once_are_the_builders_ids(count: int) -> None:
    """One ``getrandbits(64 * n)`` gives the ids n calls of ``getrandbits(64) or 1`` give, in order."""
    for seed in range(5):
        one_by_one, at_once = random.Random(seed), random.Random(seed)
        expected = [f"{one_by_one.getrandbits(64) or 1:016x}" for _ in range(count)]
        assert step_columns.span_id_texts(at_once.getrandbits, count) == expected
        assert at_once.getrandbits(64) == one_by_one.getrandbits(64)  # the generator moved as far


def test_a_zero_span_id_is_written_as_one() -> None:
    """A draw of 0 (one in 2**64) is the builder's id 1, wherever it falls in the batch."""
    ids = [5, 0, 2**64 - 1, 0]
    whole = sum(value << (64 * i) for i, value in enumerate(ids))
    texts = step_columns.span_id_texts(lambda bits: whole if bits == 64 * len(ids) else 0, len(ids))
    assert texts == [f"{value or 1:016x}" for value in ids]


def test_trace_ids_as_hex_are_the_contracts_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both forms follow docs/telemetry.md: the first 16 bytes of sha256(run_id + "\0" + N)."""
    steps = [0, 1, 7, 10**6, 2**62, *random.Random(3).sample(range(10**9), 200)]
    for run_id in ("run-1", RANK.run_id, "ü\x00,%s"):
        documented = [int.from_bytes(hashlib.sha256(f"{run_id}\x00{s}".encode()).digest()[:16], "big")
                      for s in steps]
        assert c.step_trace_ids_hex(run_id, steps) == [f"{value:032x}" for value in documented]
        assert [c.step_trace_id(run_id, s) for s in steps] == documented

    class ZeroDigest:  # a hash of 0 (one in 2**128): the trace id is 1
        def __init__(self, data: bytes) -> None:
            pass

        def hexdigest(self) -> str:
            return "0" * 64

        def digest(self) -> bytes:
            return bytes(32)

    monkeypatch.setattr(c.hashlib, "sha256", ZeroDigest)
    one = "0" * 31 + "1"
    assert c.step_trace_ids_hex("r", [1, 2]) == [f"{c.step_trace_id('r', 1):032x}"] * 2 == [one] * 2
