"""Read a source and diagnose it: the library calls behind ``traceml analyze``."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.findings import RunAnalysis
from traceml_otel.analyze.manifest import RunManifest, read_manifest
from traceml_otel.analyze.records import WindowSpec
from traceml_otel.analyze.sources.base import ReadLog, SpanSource
from traceml_otel.analyze.sources.files import FileSpanSource


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
    source: SpanSource, window: WindowSpec | None = None, manifest: RunManifest | None = None
) -> RunAnalysis:
    """Load ``source`` and diagnose its run.

    Raises:
        SourceError: the source cannot be read (see :mod:`traceml_otel.analyze.sources.base`).
    """
    with paused_gc():
        return analyze_run(source.load(), window, manifest)


def analyze_path(
    paths: Sequence[Path],
    *,
    run_id: str | None = None,
    service: str | None = None,
    window: WindowSpec | None = None,
    log: ReadLog | None = None,
) -> RunAnalysis:
    """Diagnose a run directory of the local copy, or OTLP JSON (Lines) files."""
    paths = [Path(p) for p in paths]
    manifest = read_manifest(paths[0]) if len(paths) == 1 and paths[0].is_dir() else None
    preferred = manifest.run_id if manifest is not None and manifest.run_id else None
    source = FileSpanSource(paths, run_id=run_id, service=service, log=log, preferred_run_id=preferred)
    return analyze_source(source, window, manifest)
