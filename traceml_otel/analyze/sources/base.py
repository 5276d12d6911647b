"""The span source interface, and the warning/progress log every source writes to."""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TextIO

from traceml_otel.analyze.assembler import StepAssembler
from traceml_otel.analyze.run_model import LoadedRun, StepTiming
from traceml_otel.errors import TracemlError
from traceml_otel.sanitize import strip_control


class SourceError(TracemlError, RuntimeError):
    """The source cannot be read at all: no files, an unreachable backend, a refused query."""


class ReadLog:
    """Named warnings and throttled progress on stderr while spans are read.

    Every warning is counted and kept (the first ``keep`` of them), and the first ``printed``
    are echoed at once. Progress lines start only once a read has taken ``progress_after`` s.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        printed: int = 20,
        keep: int = 50,
        progress_after: float = 2.0,
        progress_every: float = 1.0,
    ) -> None:
        self._stream = stream
        self._printed = printed
        self._keep = keep
        self._progress_after = progress_after
        self._progress_every = progress_every
        self._started = time.monotonic()
        self._last_progress = 0.0
        self.warnings: list[str] = []
        self.total = 0

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def warn(self, message: str) -> None:
        """Record (and maybe print) one warning, e.g. ``run/rank-0.traces.jsonl:17: truncated JSON``."""
        self.total += 1
        message = strip_control(message)  # warnings quote span data and exception text
        if len(self.warnings) < self._keep:
            self.warnings.append(message)
        if self.total <= self._printed:
            print(f"traceml analyze: warning: {message}", file=self.stream)
        elif self._printed and self.total == self._printed + 1:
            print("traceml analyze: warning: more warnings follow; see the report", file=self.stream)

    def progress(self, what: str) -> None:
        """Report progress (``what`` is a short status) if the read is long enough to need it."""
        now = time.monotonic()
        if now - self._started < self._progress_after or now - self._last_progress < self._progress_every:
            return
        self._last_progress = now
        print(f"traceml analyze: {what} ({now - self._started:.0f} s)", file=self.stream, flush=True)


def sample_note(steps: Sequence[StepTiming]) -> str:
    """What the report says after the source when the span budget sampled the steps read (else "")."""
    weights = [s.weight for s in steps]
    if all(w == 1.0 for w in weights):
        return ""
    sampled = sum(w != 1.0 for w in weights)
    lowest = 1.0 / max(weights)
    return (f" (a sample: {len(steps):,} steps read stand for about {sum(weights):,.0f}; {sampled:,} of them "
            f"sampled at probability {lowest:.3g} or higher, the others kept as anomalous; means and shares "
            "weighted by 1/probability)")


class SpanSource(ABC):
    """Where a run's spans come from. :meth:`load` rebuilds its steps.

    Args:
        run_id: keep only spans of this run; default: the run with the most steps.
        service: keep only spans whose resource ``service.name`` is this.
        log: where warnings and progress go (default: a :class:`ReadLog` on stderr).
        preferred_run_id: without ``run_id``, the run to pick when it is present (the manifest's).
    """

    def __init__(
        self,
        *,
        run_id: str | None = None,
        service: str | None = None,
        log: ReadLog | None = None,
        preferred_run_id: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.service = service
        self.log = log if log is not None else ReadLog()
        self.preferred_run_id = preferred_run_id

    @abstractmethod
    def describe(self) -> str:
        """Where the spans come from, for the report header."""

    @abstractmethod
    def feed(self, assembler: StepAssembler) -> None:
        """Stream every span of the source into ``assembler``; raises :class:`SourceError`."""

    def load(self) -> LoadedRun:
        """Read the source and return the chosen run's steps."""
        assembler = StepAssembler()
        self.feed(assembler)
        found = assembler.run_ids()
        if self.run_id is not None:
            run_id = self.run_id
        elif self.preferred_run_id in found:
            run_id = self.preferred_run_id
        else:
            run_id = found[0] if found else ""
        others = tuple(r for r in found if r != run_id)
        if self.run_id is None and others:
            self.log.warn(
                f"{len(found)} runs found; analysing {run_id or '(no run id)'} "
                f"(choose with --run-id: {', '.join(others[:5])})"
            )
        if assembler.duplicate_steps:
            self.log.warn(f"{assembler.duplicate_steps} step spans seen twice; the last one was kept")
        steps, orphans = assembler.steps(run_id)
        return LoadedRun(
            run_id=run_id,
            steps=tuple(steps),
            source=self.describe() + sample_note(steps),
            service=self.service or ", ".join(assembler.services(run_id)),
            spans_read=assembler.spans,
            foreign_spans=assembler.foreign_spans,
            orphan_steps=orphans,
            other_run_ids=others,
            warnings=tuple(self.log.warnings),
            warnings_total=self.log.total,
            hosts=assembler.hosts(run_id),
        )
