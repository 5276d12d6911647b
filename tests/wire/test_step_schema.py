"""The step schema is the one declaration: every form of a step is made from it or agrees with it.

The frozen orders (the wire row's, the step span's attributes, the step table's header) are pinned
here as literals: the table may only grow at their ends. A field added to a copy of the table reaches
every derived form (slots, decoder, span attributes, the fast and reference encoders, the CSV header
and DuckDB's columns) with no other edit but the record's field.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_otel import contract as c
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.emit.spans import step_attributes_source
from traceml_otel.step_records import StepRecord
from traceml_otel.wire import step_schema as schema
from traceml_otel.wire.step_row import StepRow
from traceml_otel.wire.step_table import COLUMNS, TABLE_VERSION

REPO = Path(__file__).resolve().parents[2]

WIRE_ORDER = ("step", "start_ns", "end_ns", "gpu_duration_ns", "input_wait_ns", "input_wait_gpu_ns",
              "input_fetches", "prefetch_h2d_ns", "optimizer_steps", "parallelism", "peak_allocated_bytes",
              "peak_reserved_bytes", "device_total_bytes", "exception_type", "phases", "collectives",
              "samples", "tokens", "loader", "source", "between_ns", "input_wait_in_step_ns",
              "skipped_updates")
"""Version 2 of the stream, slot by slot (only ever appended to)."""
OPTIONAL_ATTRIBUTES = (
    c.ATTR_STEP_GPU_DURATION, c.ATTR_INPUT_WAIT_CPU, c.ATTR_INPUT_WAIT_GPU, c.ATTR_OPTIMIZER_SKIPPED,
    c.ATTR_INPUT_WAIT_IN_STEP_CPU, c.ATTR_PREFETCH_H2D_CPU, c.ATTR_MEM_PEAK_ALLOCATED,
    c.ATTR_MEM_PEAK_RESERVED, c.ATTR_MEM_TOTAL, c.ATTR_EXCEPTION_TYPE, c.ATTR_STEP_SOURCE,
    c.ATTR_BETWEEN_STEPS_CPU, c.ATTR_INPUT_WAIT_FETCHES, c.ATTR_STEP_SAMPLES, c.ATTR_STEP_TOKENS,
)
"""The step span's optional attributes in the order the local copy has always written them."""
HEADER_V1 = (
    "run_id,rank,step,trace_id,start_unix_nano,parallelism,world_size,traced_cpu,traced_gpu,"
    "input_wait_cpu,input_wait_gpu,prefetch_h2d_cpu,calls_forward,calls_backward,calls_optimizer,"
    "calls_h2d,cpu_forward,cpu_backward,cpu_optimizer,cpu_h2d,gpu_forward,gpu_backward,gpu_optimizer,"
    "gpu_h2d,optimizer_steps,peak_allocated,peak_reserved,memory_total,error,samples,tokens,comm_calls,"
    "comm_bytes,comm_cpu,comm_gpu,comm_exposed_cpu,comm_exposed_gpu,comm_in_forward_cpu,"
    "comm_in_backward_cpu,comm_in_optimizer_cpu,comm_in_h2d_cpu,comm_in_forward_gpu,"
    "comm_in_backward_gpu,comm_in_optimizer_gpu,comm_in_h2d_gpu,comm_entries,comm_work,between_cpu,"
    "source,host_cpus,loader_num_workers,loader_pin_memory,loader_persistent_workers,"
    "loader_prefetch_factor,loader_batch_size,loader_dataset,spans"
)


def test_the_frozen_orders_are_the_tables() -> None:
    assert tuple(f.name for f in schema.WIRE_ORDER)[:len(WIRE_ORDER)] == WIRE_ORDER  # appended only
    assert tuple(StepRow.of(**{n: n for n in WIRE_ORDER}))[:len(WIRE_ORDER)] == WIRE_ORDER
    source = step_attributes_source(schema.STEP_FIELDS)
    assert [name for name in OPTIONAL_ATTRIBUTES if repr(name) in source] == list(OPTIONAL_ATTRIBUTES)
    assert sorted(OPTIONAL_ATTRIBUTES, key=lambda name: source.index(repr(name))) == list(OPTIONAL_ATTRIBUTES)
    assert ",".join(COLUMNS).startswith(HEADER_V1)  # columns are appended (with a new TABLE_VERSION)
    assert TABLE_VERSION > 1 or ",".join(COLUMNS) == HEADER_V1


def test_a_table_that_is_not_one_layout_is_refused() -> None:
    first = schema.STEP_FIELDS[0]
    with pytest.raises(ValueError, match="slots"):
        schema.check((*schema.STEP_FIELDS, dataclasses.replace(first, name="again")))
    with pytest.raises(ValueError, match="declared twice"):
        schema.check((*schema.STEP_FIELDS, dataclasses.replace(first, slot=schema.ROW_FIELDS)))


def test_the_hand_written_records_agree_with_the_table() -> None:
    """StepRecord has one field per slot, with the slot's default; every column is a StepTiming field
    (the readers fill them by name) but those that sum into h2d (``h2d_before_cpu``, their sum); every
    attribute is the contract's."""
    record_fields = {f.name: f.default for f in dataclasses.fields(StepRecord)}
    assert set(record_fields) == {f.record_field for f in schema.STEP_FIELDS}
    for f in schema.STEP_FIELDS:
        if f.slot >= schema.FIRST_LAYOUT_FIELDS:  # an older trainer's row decodes to the record's default
            assert record_fields[f.record_field] == f.default or (f.default, record_fields[f.record_field]) \
                == ((), ()), f.name
    assert {f.column for f in schema.STEP_FIELDS if f.column and not f.sums_into} <= set(StepTiming._fields)
    assert schema.H2D_BEFORE_STEP and "h2d_before_cpu" in StepTiming._fields  # their sum, by the schema
    contract_values = {v for k, v in vars(c).items() if k.startswith("ATTR_")}
    assert {f.attribute for f in schema.STEP_FIELDS if f.attribute} <= contract_values


_LOAD_A_COPY = textwrap.dedent('''
    import dataclasses, importlib.util, sys, tempfile
    from pathlib import Path
    import traceml_otel.wire
    import traceml_otel.step_records as records
    from traceml_otel.wire.step_schema import ROW_FIELDS as n  # slots today: the new one is slot n

    def load_schema_with(name, declaration):
        """Make the schema module a copy of step_schema.py with ``declaration`` (a StepField of slot n)
        appended to its table, and StepRecord one with the field ``name`` (the one other declaration:
        typed records between stages)."""
        del sys.modules["traceml_otel.wire.step_schema"]
        source = (Path(traceml_otel.wire.__file__).parent / "step_schema.py").read_text()
        end = source.index("\\n)\\n\\nFIRST_LAYOUT_FIELDS")
        copy = Path(tempfile.mkdtemp()) / "step_schema.py"
        copy.write_text(source[:end] + "\\n    " + declaration + "," + source[end:])
        spec = importlib.util.spec_from_file_location("traceml_otel.wire.step_schema", copy)
        schema = importlib.util.module_from_spec(spec)
        sys.modules["traceml_otel.wire.step_schema"] = schema
        spec.loader.exec_module(schema)
        records.StepRecord = dataclasses.make_dataclass(
            "StepRecord", [(name, "int | None", dataclasses.field(default=None))],
            bases=(records.StepRecord,), slots=True, unsafe_hash=True)
        return schema
''')
"""A script prelude: ``load_schema_with`` and the new field's slot ``n``."""

_ADD_A_FIELD = _LOAD_A_COPY + textwrap.dedent('''
    """Load a copy of the schema with one more field, then every module that derives from it."""
    import csv, io, random
    schema = load_schema_with(
        "dummy_ns", f'StepField("dummy_ns", {n}, int, "A field a test added.", scale=NS, '
        'attribute="traceml.dummy.cpu_duration", column="dummy_cpu", sql="DOUBLE")')

    from traceml_otel.analyze.sources.step_table import COLUMNS_SQL
    from traceml_otel.emit.spans import RankInfo, StepSpanBuilder
    from traceml_otel.emit.step_table import csv_line, step_row
    from traceml_otel.wire.step_row import ROW_FIELDS, APPENDED_DEFAULTS, StepRow, decode_step
    from traceml_otel.wire.step_table import COLUMNS, COLUMN_TYPES
    from tests.emit import test_step_lines as t

    assert ROW_FIELDS == n + 1 and APPENDED_DEFAULTS[-1] is None
    row = StepRow.of(step=1, start_ns=10, end_ns=20, dummy_ns=7)
    assert len(row) == n + 1 and row.dummy_ns == 7 and row[n] == 7
    row.dummy_ns = 8
    assert row[n] == 8
    assert StepRow.from_wire(list(row[:n])).dummy_ns is None  # a trainer without it still decodes
    assert decode_step(row, 0).dummy_ns == 8

    built = StepSpanBuilder(RankInfo("r", 0, 0, 1, 0, "h")).build(decode_step(row, 0))
    assert built.step.attributes["traceml.dummy.cpu_duration"] == 8 * 1e-9
    assert COLUMNS[-1] == "dummy_cpu" and COLUMN_TYPES[-1] == ("dummy_cpu", "DOUBLE")
    assert step_row(built)[-1] == 8 * 1e-9 and "'dummy_cpu': 'DOUBLE'" in COLUMNS_SQL

    values = random.Random(5)
    rows = []
    for step in range(600):  # today's rows (padded by the decoder's rule), each with the new slot
        row = StepRow.from_wire(t._row(t._record(step, random.Random(step % 8), values))[:n])
        rows.append([*row[:n], values.choice([None, step * 1000])])
    fast_spans, fast_lines, lines = t._fast(rows, seed=3)
    assert (fast_spans, fast_lines) == t._reference(rows, seed=3)  # the fast path carries it too
    assert lines.reference_steps < 30, lines.reference_steps
    assert fast_spans.count('"traceml.dummy.cpu_duration"') == sum(r[n] is not None for r in rows)
    parsed = list(csv.reader(io.StringIO(fast_lines)))
    assert [p[-1] for p in parsed] == ["" if r[n] is None else repr(r[n] * 1e-9) for r in rows]

    import duckdb
    table = Path(tempfile.mkdtemp()) / "rank-0.steps.csv"
    table.write_text(",".join(COLUMNS) + "\\n" + fast_lines)
    read = duckdb.sql(f"SELECT dummy_cpu FROM read_csv('{table}', header = true, auto_detect = false, "
                      f"columns = {COLUMNS_SQL})").fetchall()
    assert [v for (v,) in read] == [None if r[n] is None else r[n] * 1e-9 for r in rows]
    print("carried")
''')


def test_a_field_added_to_a_copy_of_the_table_reaches_every_derived_form() -> None:
    done = subprocess.run([sys.executable, "-c", _ADD_A_FIELD], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "carried"


_ADD_A_COPY_FIELD = _LOAD_A_COPY + textwrap.dedent('''
    """A copy of the schema with a second field that sums into h2d: the analysis adds it in, unnamed."""
    import duckdb
    schema = load_schema_with(
        "dummy_h2d_ns", f'StepField("dummy_h2d_ns", {n}, int, "Copies a test added.", scale=NS, '
        'sums_into="h2d", attribute="traceml.dummy.h2d.cpu_duration", column="dummy_h2d_cpu", sql="DOUBLE")')

    from traceml_otel import contract as c
    from traceml_otel.analyze import columnar_sql
    from traceml_otel.analyze.assembler import StepAssembler
    from traceml_otel.analyze.kinds import Clock
    from traceml_otel.analyze.measures import step_parts, step_time
    from traceml_otel.analyze.span_schema import WANTED_ATTRIBUTES
    from traceml_otel.analyze.sources.step_table import COLUMNS_SQL, step_timing
    from traceml_otel.wire.step_table import COLUMNS

    assert len(schema.H2D_BEFORE_STEP) == 2 and "traceml.dummy.h2d.cpu_duration" in WANTED_ATTRIBUTES
    values = {c.ATTR_RUN_ID: "r", c.ATTR_RANK: 0, c.ATTR_STEP: 0, c.ATTR_STEP_CPU_DURATION: 0.5,
              c.ATTR_INPUT_WAIT_CPU: 0.25, c.ATTR_PREFETCH_H2D_CPU: 0.125,
              "traceml.dummy.h2d.cpu_duration": 0.0625}
    assembler = StepAssembler()
    assembler.add_span(c.SPAN_STEP, values, {})
    (step,), _ = assembler.steps("r")
    assert step.h2d_before_cpu == 0.1875, step
    wait, traced, *_, h2d, h2d_in, _ = step_parts(step, False)
    assert (h2d, step_time(wait, traced, h2d, h2d_in)) == (0.1875, 0.9375)

    columns = {"run_id": "r", "rank": 0, "step": 0, "traced_cpu": 0.5, "input_wait_cpu": 0.25,
               "prefetch_h2d_cpu": 0.125, "dummy_h2d_cpu": 0.0625}
    columns |= {f"calls_{p}": 0 for p in c.PHASES}
    row = [columns.get(name) for name in COLUMNS]
    assert step_timing(row).h2d_before_cpu == 0.1875
    table = Path(tempfile.mkdtemp()) / "rank-0.steps.csv"
    table.write_text(",".join(COLUMNS) + "\\n" + ",".join("" if v is None else str(v) for v in row) + "\\n")
    duckdb.execute(f"CREATE TABLE t AS SELECT * FROM read_csv('{table}', header = true, auto_detect = false, "
                   f"columns = {COLUMNS_SQL})")
    got = duckdb.execute(f"SELECT h2d, whole FROM ({columnar_sql.measured_rows(Clock.CPU, 't')})").fetchall()
    assert got == [(0.1875, 0.9375)], got
    print("summed")
''')


def test_a_field_that_sums_into_h2d_reaches_the_analysis_unnamed() -> None:
    """A second field flagged ``sums_into="h2d"`` in a copy of the table: the span reader, the columnar
    engine's step rows and SQL, and the step time all add it to the copies made before the block."""
    done = subprocess.run([sys.executable, "-c", _ADD_A_COPY_FIELD], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "summed"
