"""The step table: one CSV row per traced step, written beside the OTLP JSON copy for the columnar reader.

``rank-R.steps.csv`` holds, per (rank, step), exactly the numbers the span reader rebuilds from that
step's spans (:class:`~traceml_otel.analyze.run_model.StepTiming`, flattened), so an embedded columnar
engine (DuckDB) can aggregate a run of millions of spans without parsing its JSON. The emitter writes
it (``emit/step_table.py``); ``rank-R.steps.json``, written when the emitter closes the table, says
how many rows it holds and whether any were lost, so a reader can tell a complete table from a cut one.

CSV because Python writes it with no dependency and DuckDB reads it in parallel at about a million
rows a second here. Empty fields are "not measured" (``None``), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from traceml_otel.contract import PHASES
from traceml_otel.wire._json import RecordError, read_json_object, write_atomically
from traceml_otel.wire.step_schema import STEP_FIELDS, StepField

TABLE_VERSION = 2
"""Bumped when the columns change; a reader refuses a table of another version (and reads the spans)."""

OTHER_COLUMN_TYPES: tuple[tuple[str, str], ...] = (
    ("run_id", "VARCHAR"),
    ("rank", "BIGINT"),
    ("trace_id", "VARCHAR"),
    ("world_size", "BIGINT"),
    ("traced_cpu", "DOUBLE"),
    *((f"calls_{phase}", "BIGINT") for phase in PHASES),
    *((f"cpu_{phase}", "DOUBLE") for phase in PHASES),
    *((f"gpu_{phase}", "DOUBLE") for phase in PHASES),
    ("error", "VARCHAR"),
    ("comm_calls", "BIGINT"),
    ("comm_bytes", "BIGINT"),
    ("comm_cpu", "DOUBLE"),
    ("comm_gpu", "DOUBLE"),
    ("comm_exposed_cpu", "DOUBLE"),
    ("comm_exposed_gpu", "DOUBLE"),
    *((f"comm_in_{phase}_cpu", "DOUBLE") for phase in PHASES),
    *((f"comm_in_{phase}_gpu", "DOUBLE") for phase in PHASES),
    ("comm_entries", "VARCHAR"),
    ("comm_work", "VARCHAR"),
    ("host_cpus", "BIGINT"),
    ("loader_num_workers", "BIGINT"),
    ("loader_pin_memory", "BOOLEAN"),
    ("loader_persistent_workers", "BOOLEAN"),
    ("loader_prefetch_factor", "BIGINT"),
    ("loader_batch_size", "BIGINT"),
    ("loader_dataset", "VARCHAR"),
    ("spans", "BIGINT"),
)
"""The columns that are not a step-row slot's (ids, the per-phase sums, collectives, loader, host), in
file order; the step-row slots' columns come from :data:`~traceml_otel.wire.step_schema.STEP_FIELDS`."""


def column_types(fields: tuple[StepField, ...] = STEP_FIELDS) -> tuple[tuple[str, str], ...]:
    """The table's columns: :data:`OTHER_COLUMN_TYPES` with each step field's column at its
    ``column_at`` (a field without one after the last column, in the schema's order)."""
    placed = sorted((f.column_at, f.column, f.sql) for f in fields if f.column and f.column_at is not None)
    columns = list(OTHER_COLUMN_TYPES)
    for at, name, sql in placed:
        columns.insert(at, (name, sql))
    columns += [(f.column, f.sql) for f in fields if f.column and f.column_at is None]
    return tuple(columns)


COLUMN_TYPES: tuple[tuple[str, str], ...] = column_types()
"""Column names and their SQL types, in file order. Integer lists (``comm_entries``, ``comm_work``)
are space-separated; the phase columns follow :data:`~traceml_otel.contract.PHASES`; ``spans``: the
step's spans in the local copy (step, phases, collectives); ``skipped_updates``: updates a
``GradScaler.step`` skipped in the step (``traceml.optimizer.skipped``; empty when none, version 2)."""

COLUMNS = tuple(name for name, _ in COLUMN_TYPES)


def table_file_name(rank: int) -> str:
    """One rank's step table inside the run directory."""
    return f"rank-{rank}.steps.csv"


def table_record_name(rank: int) -> str:
    """The record of one rank's step table (rows written, whether it is complete)."""
    return f"rank-{rank}.steps.json"


@dataclass(frozen=True, slots=True)
class TableRecord:
    """What the emitter says about one rank's step table when it closes it."""

    run_id: str
    rank: int
    rows: int
    """Rows written (one per step handed to the emitter while the table was on)."""
    complete: bool
    """Every step the trainer traced has its row (no write failed, nothing dropped before the emitter)."""
    problem: str = ""
    """Why it is not complete, when known."""
    service: str = ""
    """The rank's ``service.name`` (its spans' resource)."""
    version: int = TABLE_VERSION


def write_table_record(run_dir: Path, record: TableRecord) -> None:
    """Write ``rank-R.steps.json`` (atomically). Raises ``OSError`` when it cannot."""
    import json

    write_atomically(run_dir / table_record_name(record.rank), json.dumps({
        "run_id": record.run_id, "rank": record.rank, "rows": record.rows, "complete": record.complete,
        "problem": record.problem, "service": record.service, "version": record.version,
    }))


def read_table_record(path: Path) -> TableRecord:
    """One ``rank-R.steps.json``; raises :class:`RecordError` when it is unreadable or malformed."""
    value = read_json_object(path)
    try:
        record = TableRecord(
            run_id=str(value["run_id"]), rank=int(value["rank"]), rows=int(value["rows"]),
            complete=value["complete"] is True, problem=str(value.get("problem") or "")[:500],
            service=str(value.get("service") or "")[:200], version=int(value.get("version", 0)),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise RecordError(f"{path}: not a step-table record ({type(error).__name__})") from None
    return record
