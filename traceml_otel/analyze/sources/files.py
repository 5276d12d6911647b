"""Spans from files: a run directory of the local copy, or OTLP JSON (Lines) files.

Reads line by line. A corrupt, truncated or foreign line is named in a warning with its
``file:line`` and skipped; the rest of the file is still read. A file whose first line is not
JSON on its own (a pretty-printed trace from Tempo or Jaeger) is read whole instead.

Large inputs of several files are split into size-balanced groups, one per CPU: this process reads
one group while forked children read the others and hand back their per-step aggregates. Forking
is only used while this process runs a single thread (a fork copies no other thread, so a lock
held elsewhere could hang the child); otherwise, and if a child fails, files are read here.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.otlp_decode import MAX_SECONDS, ForeignDocument, resource_spans
from traceml_otel.analyze.sources.base import ReadLog, SourceError, SpanSource
from traceml_otel.analyze.sources.otlp_json import MALFORMED, feed_resource_spans
from traceml_otel.wire.bounded_file import RefusedFile, bounded_lines, file_kind, open_regular, read_bounded

TRACE_FILES = c.traces_file_name(0).replace("0", "<R>", 1)
"""How the per-rank span files are named (for messages; the names come from the contract)."""
WHOLE_FILE_LIMIT = 64 * 1024 * 1024
"""Largest file (bytes) read whole when it is not JSON Lines (decoded, it takes about ten times that)."""
PARALLEL_MIN_BYTES = 48 * 1024 * 1024
"""Inputs smaller than this are read in this process (a pool costs about a second to start)."""
_PROGRESS_LINES = 16
"""Check whether to print progress every this many lines (a line holds a batch of spans)."""


def trace_files(paths: Sequence[Path]) -> list[Path]:
    """The span files named by ``paths``: run directories expand to their per-rank files."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = rank_trace_files(path) or sorted(path.glob("*.jsonl"))
            if not found:
                raise SourceError(f"{path}: no {TRACE_FILES} or *.jsonl files in this directory")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise SourceError(f"{path}: is {file_kind(path.stat().st_mode)}, not a regular file; not read")
        else:
            raise SourceError(f"{path}: no such file or directory")
    return files


def rank_trace_files(directory: Path) -> list[Path]:
    """The per-rank local-copy files in ``directory`` (named by ``contract.traces_file_name``), by rank."""
    ranked = []
    for entry in directory.iterdir():
        rank = c.rank_of_file(entry.name, c.traces_file_name)
        if rank is not None:
            ranked.append((rank, entry))
    return [path for _, path in sorted(ranked)]


def _workers(files: Sequence[Path]) -> int:
    """How many processes should read ``files`` (1 = this one alone)."""
    if len(files) < 2 or sum(_size(f) for f in files) < PARALLEL_MIN_BYTES:
        return 1
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(len(files), cpus))


def _size(path: Path) -> int:
    """Bytes of data in a regular file (0 for anything else: it is skipped when read)."""
    try:
        info = path.stat()
    except OSError:
        return 0
    if file_kind(info.st_mode) is not None:
        return 0
    return min(info.st_size, info.st_blocks * 512) if hasattr(info, "st_blocks") else info.st_size


def balanced_groups(files: Sequence[Path], count: int) -> list[list[Path]]:
    """Split ``files`` into ``count`` groups of similar total size (largest first, to the lightest)."""
    groups: list[list[Path]] = [[] for _ in range(count)]
    loads = [0] * count
    for path in sorted(files, key=lambda f: -_size(f)):
        lightest = loads.index(min(loads))
        groups[lightest].append(path)
        loads[lightest] += _size(path)
    return [group for group in groups if group]


class FileSpanSource(SpanSource):
    """Spans from local files (our local copy, or a collector ``file`` exporter dump)."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        run_id: str | None = None,
        service: str | None = None,
        log: ReadLog | None = None,
        workers: int | None = None,
        preferred_run_id: str | None = None,
    ) -> None:
        super().__init__(run_id=run_id, service=service, log=log, preferred_run_id=preferred_run_id)
        self.paths = [Path(p) for p in paths]
        self.workers = workers

    def describe(self) -> str:
        if len(self.paths) == 1:
            return str(self.paths[0])
        return f"{len(self.paths)} files ({self.paths[0]}, ...)"

    def feed(self, assembler: StepAssembler) -> None:
        files = trace_files(self.paths)
        workers = self.workers if self.workers is not None else _workers(files)
        if workers > 1:
            self._feed_parallel(files, assembler, workers)
            return
        for path in files:
            self.feed_file(path, assembler)

    def _feed_parallel(self, files: Sequence[Path], assembler: StepAssembler, workers: int) -> None:
        """Read the first group here and the others in forked children; join their aggregates."""
        mine, *theirs = balanced_groups(files, workers)
        with tempfile.TemporaryDirectory(prefix="traceml-analyze-") as scratch:
            children = [
                (self._fork_reader(group, Path(scratch) / f"group-{i}.pickle"), group, i)
                for i, group in enumerate(theirs)
            ]
            for path in mine:
                self.feed_file(path, assembler)
            self.log.progress(f"read {len(mine)} of {len(files)} files, joining {len(children)} reader(s)")
            for pid, group, index in children:
                part = _child_result(pid, Path(scratch) / f"group-{index}.pickle")
                if part is None:
                    for path in group:
                        self.feed_file(path, assembler)
                    continue
                child_assembler, warnings = part
                for message in warnings:
                    self.log.warn(message)
                assembler.merge(child_assembler)

    def _fork_reader(self, group: Sequence[Path], out: Path) -> int:
        """Fork a child that reads ``group`` and pickles its assembler and warnings to ``out``."""
        pid = os.fork()
        if pid:
            return pid
        status = 1
        try:
            log = ReadLog(printed=0, keep=1000, progress_after=float("inf"))
            part = StepAssembler()
            reader = FileSpanSource(group, service=self.service, log=log, workers=1)
            for path in group:
                reader.feed_file(path, part)
            with out.open("wb") as handle:
                pickle.dump((part, log.warnings), handle, protocol=pickle.HIGHEST_PROTOCOL)
            status = 0
        finally:
            os._exit(status)

    def feed_file(self, path: Path, assembler: StepAssembler) -> None:
        """Stream one file's spans into ``assembler``, warning about every line it skips.

        Only a regular file is read (a FIFO, socket or device is skipped with one warning, without
        blocking); each line is bounded (:data:`~traceml_otel.wire.bounded_file.MAX_LINE_BYTES`), and
        NUL runs and sparse-file holes are skipped unread.
        """
        try:
            fd = open_regular(path)
        except RefusedFile as error:
            self.log.warn(f"{error}; skipped")
            return
        try:
            size = max(1, os.fstat(fd).st_size)
            for line in bounded_lines(fd):
                if line.data is None:
                    self.log.warn(f"{path}:{line.number}: {line.skipped}")
                    continue
                try:
                    document = json.loads(line.data)
                except (ValueError, RecursionError) as exc:
                    if line.number == 1 and not isinstance(exc, RecursionError) and self._feed_whole_file(
                        path, assembler
                    ):
                        return
                    where = f"{path}:{line.number}"
                    self.log.warn(f"{where}: skipped a corrupt or truncated line ({_reason(exc)})")
                    continue
                self._feed_document(document, assembler, f"{path}:{line.number}")
                if line.number % _PROGRESS_LINES == 0:
                    self.log.progress(
                        f"reading {path.name}: {line.offset / size:.0%}, {assembler.spans:,} spans"
                    )
        except OSError as error:
            self.log.warn(f"{path}: reading stopped ({error.strerror or error}); the lines before were used")
        finally:
            os.close(fd)

    def _feed_whole_file(self, path: Path, assembler: StepAssembler) -> bool:
        try:
            document = json.loads(read_bounded(path, WHOLE_FILE_LIMIT))
        except (RefusedFile, ValueError, RecursionError):
            return False
        self._feed_document(document, assembler, str(path))
        return True

    def _feed_document(self, document: object, assembler: StepAssembler, where: str) -> None:
        try:
            resources = resource_spans(document)
        except ForeignDocument as exc:
            self.log.warn(f"{where}: skipped a line that holds no OTLP traces ({exc})")
            return
        except RecursionError:
            self.log.warn(f"{where}: skipped a line nested too deeply to be OTLP traces")
            return
        out_of_range = assembler.out_of_range_values
        try:
            feed_resource_spans(resources, assembler, service=self.service)
        except MALFORMED as exc:
            self.log.warn(f"{where}: skipped malformed OTLP spans ({type(exc).__name__}: {exc})")
        if assembler.out_of_range_values > out_of_range:
            self.log.warn(f"{where}: {assembler.out_of_range_values - out_of_range} duration value(s) out of "
                          f"range (beyond {MAX_SECONDS:g} s) treated as bad data (not measured)")


def _child_result(pid: int, out: Path) -> tuple[StepAssembler, list[str]] | None:
    """Wait for a reader child; its result, or ``None`` if it failed."""
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    try:
        with out.open("rb") as handle:
            return pickle.load(handle)  # our own child's output, in our own scratch directory
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def _reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    return text if len(text) <= 80 else text[:77] + "..."
