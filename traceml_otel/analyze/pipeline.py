"""Read a source and diagnose it: the library calls behind ``traceml analyze``."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from traceml_otel.analyze.captures import (
    NO_CAPTURES,
    CaptureAnalysis,
    blame_in_flight,
    captured_steps,
    cite,
    read_captures,
)
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.run_model import StepTiming, WindowSpec
from traceml_otel.analyze.sources.base import ReadLog, SpanSource
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.analyze.stalls import HANG
from traceml_otel.wire.cpu_record import CpuRecord
from traceml_otel.wire.export_stats import ExportStats, ExportStatsRead, read_export_stats
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.manifest import Manifest, ManifestRead, read_manifest


@contextmanager
def paused_gc() -> Iterator[None]:
    """Hold the cyclic garbage collector during a read.

    A read allocates millions of short-lived, acyclic JSON containers while keeping a growing
    table of aggregates; each automatic collection walks that table again (a third of the read
    time at a million spans). Reference counting still frees everything as it goes.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def analyze_source(
    source: SpanSource, window: WindowSpec | None = None, manifest: Manifest | None = None,
    export_stats: Sequence[ExportStats] = (), notes: Sequence[str] = (),
) -> RunAnalysis:
    """Load ``source`` and diagnose its run (``export_stats`` and ``notes``: see :func:`analyze_run`).

    Raises:
        SourceError: the source cannot be read (see :mod:`traceml_otel.analyze.sources.base`).
    """
    with paused_gc():
        return analyze_run(source.load(), window, manifest, export_stats, notes)


ENGINES = ("auto", "python", "columnar")
"""``--engine``: chosen by size, the span reader, or the step tables in DuckDB."""


def analyze_path(
    paths: Sequence[Path],
    *,
    run_id: str | None = None,
    service: str | None = None,
    window: WindowSpec | None = None,
    log: ReadLog | None = None,
    engine: str = "auto",
) -> RunAnalysis:
    """Diagnose a run directory of the local copy, or OTLP JSON (Lines) files.

    ``engine``: ``python`` reads the spans; ``columnar`` the run directory's step tables in DuckDB
    (raises :class:`SourceError` when it cannot: DuckDB missing, tables incomplete); ``auto`` the
    columnar engine for a run directory of at least
    :data:`~traceml_otel.analyze.engine_choice.COLUMNAR_MIN_BYTES` of spans whose tables are
    complete, else the span reader (saying why, for a large run).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    paths = [Path(p) for p in paths]
    run_dir = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    manifest_read = read_manifest(run_dir) if run_dir is not None else ManifestRead(None)
    exports = read_export_stats(run_dir) if run_dir is not None else ExportStatsRead()
    manifest = manifest_read.manifest
    notes = [*([manifest_read.problem] if manifest_read.problem else []), *exports.problems]
    preferred = manifest.run_id if manifest is not None and manifest.run_id else None
    cpu = _run_cpu(run_dir)  # read once: the stalls (busy gaps) and the run's noise both use them
    if engine != "python":
        from traceml_otel.analyze.engine_choice import try_columnar

        done, note = try_columnar(run_dir, engine, run_id=run_id, service=service, window=window,
                                  manifest=manifest, export_stats=exports.stats, notes=notes, cpu=cpu)
        if done is not None:
            analysis, steps = done
            analysis = _with_cpu_samples(_with_hang_records(analysis, run_dir, manifest), cpu)
            analysis = _with_time_accounting(analysis, analysis.run.run_id, steps, run_dir, manifest)
            return with_captures(analysis, NO_CAPTURES if run_dir is None
                                 else read_captures(run_dir, analysis.run.run_id))
        if note:
            notes.append(note)
    source = FileSpanSource(paths, run_id=run_id, service=service, log=log, preferred_run_id=preferred)
    with paused_gc():
        loaded = source.load()
        hangs = _run_hangs(run_dir, loaded.run_id)
        captures = NO_CAPTURES if run_dir is None else read_captures(run_dir, loaded.run_id)  # read once
        captured = captured_steps(captures.captures, loaded.steps)
        analysis = analyze_run(loaded, window, manifest, exports.stats, notes, hangs, captured, cpu)
    analysis = _with_cpu_samples(_with_hang_records(analysis, run_dir, manifest), cpu)
    analysis = _with_time_accounting(analysis, loaded.run_id, loaded.steps, run_dir, manifest)
    return with_captures(analysis, captures)


def _with_cpu_samples(analysis: RunAnalysis, cpu: Sequence[CpuRecord]) -> RunAnalysis:
    """Add the training thread's CPU wait and on-CPU shares (``rank-R.cpu.json``, read by
    :func:`_run_cpu`) to the run's noise, and check the INPUT_BOUND advice against the workers' measured
    CPU use."""
    from traceml_otel.analyze.advice import for_cpu_use, worker_cpu_use
    from traceml_otel.analyze.compare_noise import with_cpu

    records = _of_run(cpu, analysis.run.run_id)
    if not records:
        return analysis
    if analysis.noise is not None:
        analysis = replace(analysis, noise=with_cpu(analysis.noise, records))
    return for_cpu_use(analysis, worker_cpu_use(records, analysis.hosts))


def _with_time_accounting(
    analysis: RunAnalysis, run_id: str, steps: Sequence[StepTiming] | None, run_dir: Path | None,
    manifest: Manifest | None,
) -> RunAnalysis:
    """Add where the time went and MFU from the run folder's ``rank-R.time.json`` records (whole run).

    ``steps`` ``None``: the columnar engine did not make records of a run this large (said in the report).
    """
    if run_dir is None:
        return analysis
    from traceml_otel.analyze.advice import for_precision
    from traceml_otel.analyze.hang import read_hang_records
    from traceml_otel.analyze.mfu import analyze_mfu
    from traceml_otel.analyze.time_accounting import account_time, read_time_records

    records, problems = read_time_records(run_dir)
    records = {rank: r for rank, r in records.items() if not r.run_id or r.run_id == run_id}
    if not records:
        return analysis
    precision = next((r.precision for _, r in sorted(records.items()) if r.precision), "")
    analysis = for_precision(analysis, precision)  # no mixed-precision advice to a run already in it
    if steps is None:
        from traceml_otel.analyze.columnar import DETAIL_ROWS, with_detail_note

        return with_detail_note(analysis, f"columnar engine: the time account and MFU are not computed above "
                                          f"{DETAIL_ROWS:,} steps; use --engine python for them")
    hangs, _ = read_hang_records(run_dir)
    hangs = [h for h in hangs if not h.run_id or h.run_id == run_id]
    launcher = manifest if manifest is not None and manifest.written_by is None else None  # traceml run
    account = account_time(steps, records, hangs, launcher.start_time if launcher else None,
                           launcher.end_time if launcher else None,
                           stalls=_stall_intervals(analysis, {h.rank for h in hangs}),
                           after_end_s=(launcher.diagnosis_s or 0.0) if launcher else 0.0,
                           startup_through=analysis.window.startup_last_step)
    if account is not None and problems:
        account = replace(account, notes=(*problems[:5], *account.notes))
    if account is not None and analysis.stalls.busy_gaps:  # long gaps that were work: between steps
        from traceml_otel.analyze.busy_gaps import busy_gaps_note

        stalls = analysis.stalls
        said = busy_gaps_note(stalls.busy_gaps, stalls.busy_gaps_left_out, bool(stalls.waited_for_work))
        account = replace(account, notes=(said, *account.notes))
    from traceml_otel.analyze.events import stalled_advice

    account = stalled_advice(account, analysis.run_findings, bool(analysis.stalls.waited_for_work))
    return replace(analysis, time_account=account,
                   mfu=analyze_mfu(steps, records, analysis.window.startup_last_step))


def _run_cpu(run_dir: Path | None) -> list[CpuRecord]:
    """The run folder's CPU samples, of every run in it (none outside a run folder); each use keeps its
    run's (:func:`_of_run`)."""
    if run_dir is None:
        return []
    from traceml_otel.analyze.compare_noise import read_cpu_records

    return read_cpu_records(run_dir, "")[0]


def _of_run(records: Sequence[CpuRecord], run_id: str) -> list[CpuRecord]:
    """The records of ``run_id`` (a record without a run id is anyone's)."""
    return [r for r in records if not r.run_id or not run_id or r.run_id == run_id]


def _run_hangs(run_dir: Path | None, run_id: str) -> list[HangRecord]:
    """The run folder's hang records of ``run_id`` (none outside a run folder)."""
    if run_dir is None:
        return []
    from traceml_otel.analyze.hang import read_hang_records

    records, _ = read_hang_records(run_dir)
    return [h for h in records if not h.run_id or not run_id or h.run_id == run_id]


def _stall_intervals(analysis: RunAnalysis, recorded: set[int]) -> dict[int, list[tuple[float, float]]]:
    """Per rank, the intervals the stall events say it made no progress (billed to ``stalled``); a
    ``HANG`` event's rank with a hang record is billed from the record (the watchdog saw the stall's
    ends, the steps only its step)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for event in analysis.stalls.events:
        for part in event.parts:
            if event.kind == HANG and part.rank in recorded:
                continue
            out.setdefault(part.rank, []).append((part.start, part.start + part.seconds))
    for part in analysis.stalls.waited_for_work:  # waiting for a peer's unmarked work between steps
        out.setdefault(part.rank, []).append((part.start, part.start + part.seconds))
    return out


def _with_hang_records(analysis: RunAnalysis, run_dir: Path | None, manifest: Manifest | None) -> RunAnalysis:
    """Add the ``HANG`` finding when the run folder holds ranks' hang records still marked hung."""
    if run_dir is None:
        return analysis
    from traceml_otel.analyze.hang import combine, read_hang_records, with_hang

    records, _problems = read_hang_records(run_dir)
    verdict = combine(records, manifest.world_size if manifest is not None else None)
    if verdict is None:
        return analysis
    return replace(analysis, run_findings=with_hang(analysis.run_findings, verdict, records))


def with_captures(analysis: RunAnalysis, view: CaptureAnalysis) -> RunAnalysis:
    """The analysis with the run folder's captures (:func:`read_captures`), its findings citing them."""
    if not (view.captures or view.refusals or view.problems or view.refused or view.in_flight):
        return analysis
    step = analysis.step
    if view.captures:
        step = replace(step, primary=cite(step.primary, view.captures),
                       issues=tuple(cite(f, view.captures) for f in step.issues))
    run_findings = analysis.run_findings
    if view.in_flight:
        run_findings = tuple(blame_in_flight(f, view.in_flight) for f in run_findings)
    return replace(analysis, step=step, captures=view, run_findings=run_findings)
