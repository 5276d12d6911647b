"""Which engine diagnoses a local run: the span reader, or the columnar engine over the step tables.

``auto`` takes the columnar engine for a run folder with at least
:data:`COLUMNAR_MIN_BYTES` of span files when DuckDB is installed and
every rank's step table is complete; otherwise the span reader, with a note in the report saying why
(for a run that large). ``columnar`` forced: any reason it cannot serve is a :class:`SourceError`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import StepTiming, WindowSpec
from traceml_otel.analyze.sources.base import SourceError
from traceml_otel.analyze.sources.step_table import (
    ColumnarUnavailable,
    TableCheck,
    check_tables,
    duckdb_module,
    load_tables,
)
from traceml_otel.wire.cpu_record import CpuRecord
from traceml_otel.wire.export_stats import ExportStats
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.manifest import Manifest

COLUMNAR_MIN_BYTES = 64 * 1024 * 1024
"""``auto`` uses the columnar engine from this much span data on (below it the span reader takes a few
seconds at most, and computes every section)."""


def try_columnar(
    run_dir: Path | None, engine: str, *, run_id: str | None, service: str | None, window: WindowSpec | None,
    manifest: Manifest | None, export_stats: Sequence[ExportStats], notes: Sequence[str],
    cpu: Sequence[CpuRecord] = (),
) -> tuple[tuple[RunAnalysis, tuple[StepTiming, ...] | None] | None, str]:
    """The columnar analysis of ``run_dir`` (and the run's rows when few), or ``None`` and a note for the
    report (``""``: nothing worth saying, a small run); ``cpu``: the run folder's CPU samples. Raises
    :class:`SourceError` when ``engine`` is ``columnar`` and it cannot be used."""
    forced = engine == "columnar"
    try:
        if run_dir is None:
            raise ColumnarUnavailable("it reads a run folder's step tables, not span files")
        if service is not None:
            raise ColumnarUnavailable("the step tables carry no service name to choose by (--service)")
        ranked = _span_files(run_dir)
        size = sum(_size(path) for _, path in ranked)
        if not forced and size < COLUMNAR_MIN_BYTES:
            return None, ""
        check = check_tables(run_dir, [rank for rank, _ in ranked], run_id=None)
        if not check.usable:
            raise ColumnarUnavailable(check.problem)
        spill = tempfile.mkdtemp(prefix="traceml-duckdb-")
        try:
            return (_analyze(check, spill, run_dir, run_id, window, manifest, export_stats, notes, cpu), "")
        finally:
            shutil.rmtree(spill, ignore_errors=True)
    except ColumnarUnavailable as error:
        if forced:
            raise SourceError(f"--engine columnar: {error}; use --engine python to read the spans") from None
        return None, f"columnar engine not used ({error}); read the spans instead"


def _analyze(
    check: TableCheck, spill: str, run_dir: Path, run_id: str | None, window: WindowSpec | None,
    manifest: Manifest | None, export_stats: Sequence[ExportStats], notes: Sequence[str],
    cpu: Sequence[CpuRecord],
) -> tuple[RunAnalysis, tuple[StepTiming, ...] | None]:
    from traceml_otel.analyze.captures import read_captures
    from traceml_otel.analyze.columnar import analyze_tables

    duckdb = duckdb_module()
    con = load_tables(check, spill)
    try:
        return analyze_tables(
            con, f"{run_dir} (step tables, columnar engine)", service=", ".join(check.services),
            run_id=run_id, spec=window, manifest=manifest, export_stats=export_stats, notes=notes,
            want_steps=any(run_dir.glob("rank-*.time.json")), hangs=_hang_records(run_dir),
            captures=read_captures(run_dir, "").captures, cpu=cpu)
    except duckdb.Error as error:  # a value past the engine's types (a sum beyond BIGINT): the spans can
        raise ColumnarUnavailable(f"the engine failed ({str(error).splitlines()[0][:300]})") from None
    finally:
        con.close()


def _hang_records(run_dir: Path) -> list[HangRecord]:
    from traceml_otel.analyze.hang import read_hang_records

    records, _ = read_hang_records(run_dir)
    return records


def _span_files(run_dir: Path) -> list[tuple[int, Path]]:
    ranked = []
    for entry in run_dir.iterdir():
        rank = c.rank_of_file(entry.name, c.traces_file_name)
        if rank is not None:
            ranked.append((rank, entry))
    return sorted(ranked)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0
