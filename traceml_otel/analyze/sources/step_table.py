"""The step tables of a run folder (``rank-R.steps.csv``), loaded into DuckDB for the columnar engine.

A table is used only when it holds what the spans hold: every rank with a span file has a table,
each table's record (``rank-R.steps.json``) says it is complete, is of this version and of the run,
and the rows DuckDB reads per rank are the rows the record names. Otherwise :func:`check_tables`
says why, and the caller reads the spans.

DuckDB is an optional extra (``pip install traceml-otel[columnar]``); it is imported here, lazily,
so the analysis-only install stays free of it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from traceml_otel import contract as c
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.errors import TracemlError
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.bounded_file import RefusedFile, open_regular
from traceml_otel.wire.step_schema import H2D_BEFORE_STEP
from traceml_otel.wire.step_table import (
    COLUMN_TYPES,
    COLUMNS,
    TABLE_VERSION,
    read_table_record,
    table_file_name,
    table_record_name,
)

MEMORY_LIMIT = "1GB"
"""DuckDB's memory limit: past it, it spills to a temporary folder rather than grow."""
INSTALL_HINT = "pip install 'traceml-otel[columnar]'"
MAX_ROW_BYTES = 8192
"""The most bytes one row (or the header) may take: a table larger than its record's rows allow is not
read (a row is about 260 bytes; the collective entry lists are bounded by ``MAX_COMM_ENTRIES``)."""


class ColumnarUnavailable(TracemlError, RuntimeError):
    """The columnar engine cannot serve this run (the message says why; the spans can)."""


def duckdb_module() -> Any:
    """The ``duckdb`` module; raises :class:`ColumnarUnavailable` when it is not installed."""
    try:
        import duckdb
    except ImportError:
        raise ColumnarUnavailable(f"the columnar engine needs DuckDB ({INSTALL_HINT})") from None
    return duckdb


@dataclass(frozen=True, slots=True)
class TableCheck:
    """The tables of one run folder, and whether they hold every step its span files hold."""

    files: tuple[Path, ...]
    rows: dict[int, int]
    """Rows per rank, as the records name them."""
    problem: str = ""
    """Why the tables cannot stand for the spans (``""``: they can)."""
    services: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.problem and bool(self.files)


def check_tables(run_dir: Path, ranks: Sequence[int], run_id: str | None = None) -> TableCheck:
    """Whether ``run_dir`` has a complete step table for each of ``ranks`` (those with span files)."""
    files, rows, services = [], {}, set()
    for rank in ranks:
        path, record_path = run_dir / table_file_name(rank), run_dir / table_record_name(rank)
        if path.is_symlink():
            return TableCheck((), {}, f"rank {rank}'s step table {path.name} is a symbolic link; "
                                      "not followed")
        if not path.is_file():
            return TableCheck((), {}, f"rank {rank} has no step table ({path.name})")
        try:
            record = read_table_record(record_path)
        except RecordError as error:
            return TableCheck((), {}, f"rank {rank}'s step table has no usable record ({error}); "
                                      "the emitter may have stopped before closing it")
        if record.version != TABLE_VERSION:
            return TableCheck((), {}, f"rank {rank}'s step table is version {record.version}, this reader "
                                      f"reads {TABLE_VERSION}")
        if not record.complete:
            why = record.problem or "no reason given"
            return TableCheck((), {}, f"rank {rank}'s step table is incomplete ({why})")
        if run_id and record.run_id != run_id:
            return TableCheck((), {}, f"rank {rank}'s step table is of run {record.run_id!r}, not {run_id!r}")
        size = path.lstat().st_size
        if size > (record.rows + 1) * MAX_ROW_BYTES:
            return TableCheck((), {}, f"rank {rank}'s step table is {size:,} bytes, more than "
                                      f"{record.rows:,} rows can hold; not read")
        files.append(path)
        rows[rank] = record.rows
        if record.service:
            services.add(record.service)
    if not files:
        return TableCheck((), {}, "no step tables")
    return TableCheck(tuple(files), rows, services=tuple(sorted(services)))


def load_tables(check: TableCheck, temp_directory: str, threads: int | None = None) -> Any:
    """A DuckDB connection holding table ``steps`` (every row of ``check``'s files); past its memory
    limit DuckDB spills into ``temp_directory`` (the caller's, removed after).

    Raises:
        ColumnarUnavailable: DuckDB is missing, a file is not a step table, or a rank's row count is
            not its record's (a table cut or appended to after it was closed).
    """
    duckdb = duckdb_module()
    config = {"memory_limit": MEMORY_LIMIT, "preserve_insertion_order": False,
              "temp_directory": temp_directory}
    try:
        con = duckdb.connect(config={**config, **({"threads": threads} if threads else {})})
    except duckdb.Error as error:  # e.g. an address-space limit below what it reserves
        raise ColumnarUnavailable(f"DuckDB did not start ({_first_line(error)})") from None
    columns = COLUMNS_SQL
    fds: list[int] = []
    try:
        for path, rows in zip(check.files, check.rows.values(), strict=True):
            fds.append(_open_table(path, rows))
        files = "[" + ", ".join(_sql_string(_fd_path(fd)) for fd in fds) + "]"
        con.execute(
            f"CREATE TABLE steps AS SELECT * FROM read_csv({files}, header = true, auto_detect = false, "
            f"columns = {columns}, quote = '\"', escape = '\"', delim = ',', null_padding = false)"
        )
        _lock_down(con)
        counted = dict(con.execute("SELECT rank, count(*) FROM steps GROUP BY rank").fetchall())
        bad = con.execute(f"SELECT rank, count(*) FROM steps WHERE {_NOT_FINITE} GROUP BY rank "
                          "ORDER BY rank LIMIT 1").fetchone()
    except (duckdb.Error, RefusedFile) as error:
        con.close()
        raise ColumnarUnavailable(f"a step table could not be read ({_first_line(error)})") from None
    except BaseException:
        con.close()
        raise
    finally:
        for fd in fds:
            os.close(fd)
    if bad is not None:
        con.close()
        raise ColumnarUnavailable(f"rank {bad[0]}'s step table holds non-finite numbers (NaN or Inf) in "
                                  f"{bad[1]:,} row(s): bad data")
    if counted != check.rows:
        con.close()
        differ = sorted(r for r in set(counted) | set(check.rows) if counted.get(r) != check.rows.get(r))
        raise ColumnarUnavailable(
            f"the step tables' rows are not what their records say (rank {differ[0]}: "
            f"{counted.get(differ[0], 0)} rows read, {check.rows.get(differ[0], 0)} recorded)")
    return con


def _open_table(path: Path, rows: int) -> int:
    """A descriptor on the table ``path``: a regular file opened without following a link, no larger
    than ``rows`` rows can be. DuckDB then reads the descriptor, never a path we were given: a run
    folder named ``run[x]`` or ``~`` is not a glob pattern or a home folder to it."""
    fd = open_regular(path, follow_links=False)
    size = os.fstat(fd).st_size
    if size > (rows + 1) * MAX_ROW_BYTES:
        os.close(fd)
        raise RefusedFile(f"{path.name}: {size:,} bytes, more than {rows:,} rows can hold; not read")
    return fd


def _fd_path(fd: int) -> str:
    """A path naming the open descriptor ``fd`` (``/proc/self/fd/N``, else ``/dev/fd/N``)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(folder):
            return f"{folder}/{fd}"
    raise RefusedFile("this system has no /proc/self/fd or /dev/fd to hand DuckDB an open file")


def _lock_down(con: Any) -> None:
    """After the tables are read: no file, network or extension access any more, and no setting may
    turn it back on (DuckDB's advice for untrusted input)."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


COLUMNS_SQL = "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in COLUMN_TYPES) + "}"
"""The table's columns and types as DuckDB's ``read_csv(columns=...)`` takes them."""
_NOT_FINITE = " OR ".join(f"NOT coalesce(isfinite({name}), true)" for name, kind in COLUMN_TYPES
                         if kind == "DOUBLE")
"""A row with a NaN or infinite number (``nan``, ``inf`` in the CSV, which DuckDB reads as numbers)."""
_AT = {name: index for index, name in enumerate(COLUMNS)}
_CALLS = itemgetter(*(_AT[f"calls_{p}"] for p in c.PHASES))
_CPU = itemgetter(*(_AT[f"cpu_{p}"] for p in c.PHASES))
_GPU = itemgetter(*(_AT[f"gpu_{p}"] for p in c.PHASES))
_COMM_CPU = itemgetter(*(_AT[f"comm_in_{p}_cpu"] for p in c.PHASES))
_COMM_GPU = itemgetter(*(_AT[f"comm_in_{p}_gpu"] for p in c.PHASES))
_FIELDS = StepTiming._fields
_HEAD = itemgetter(*(_AT[name] for name in _FIELDS[:_FIELDS.index("h2d_before_cpu")]))
"""The columns that are :class:`StepTiming` fields of the same name, up to the copies made before the
block (the record names them in the table's order; ``tests/wire/test_step_schema.py`` checks it)."""
_H2D_BEFORE = tuple(_AT[str(f.column)] for f in H2D_BEFORE_STEP)
"""The columns that sum into ``StepTiming.h2d_before_cpu`` (the schema's fields that sum into h2d)."""
assert _FIELDS.index("h2d_before_cpu") + 1 == _FIELDS.index("phase_calls")
_MIDDLE = itemgetter(*(_AT[name] for name in
                       _FIELDS[_FIELDS.index("optimizer_steps"):_FIELDS.index("phase_comm_cpu")]))
"""The same, from ``optimizer_steps`` to ``comm_exposed_gpu``."""
_TAIL = (_AT["comm_entries"], _AT["comm_work"], _AT["between_cpu"], _AT["source"], _AT["skipped_updates"])


def step_timing(row: Sequence[Any]) -> StepTiming:
    """One row (every column, in :data:`COLUMNS` order) as the span reader's :class:`StepTiming`."""
    run_id, rank, step, trace_id, start, parallelism, *clocks = _HEAD(row)
    entries, work, between, source, skipped = (row[i] for i in _TAIL)
    before = [row[i] for i in _H2D_BEFORE if row[i] is not None]
    return StepTiming(
        run_id or "", rank, step, trace_id or "", start or 0, parallelism or "none", *clocks,
        sum(before) if before else None,
        tuple(n or 0 for n in _CALLS(row)), _CPU(row), _GPU(row), *_MIDDLE(row),
        tuple(v or 0.0 for v in _COMM_CPU(row)), tuple(v or 0.0 for v in _COMM_GPU(row)),
        _int_list(entries), _int_list(work), between, source, skipped or 0,
    )


def _int_list(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split()[: c.MAX_COMM_ENTRIES])
    except ValueError:
        return None


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
