"""The emitter's side of a hang: the rank's hang record becomes a span and a live metric.

The training process's watchdog (:mod:`traceml_otel.capture.watchdog`) writes ``rank-R.hang.json``
into the run folder. The emitter looks at that file at most once a second while it is idle (one
``stat``), and when it changes:

- a first ``hung`` record becomes one ``traceml.hang`` span (in the trace of the step it hung in,
  with the phase, ``file:line``, the collective waited in and the training thread's stack), written
  to the local copy and offered to OTLP like the step spans. The span also carries the verdict over
  every rank (:mod:`traceml_otel.wire.hang_verdict`: the culprit ranks, the culprit's ``file:line``,
  the waiting ranks, the sentence), from the other ranks' records in the run folder: it is sent once
  every rank of the world has written its record, or :data:`GATHER_S` after this rank's own (one
  listing of the folder a second until then, then one bounded read of each record);
- ``traceml.progress.stalled`` reports the seconds without progress and the phase, and drops back
  to 0 when the record says ``resolved``.
"""

from __future__ import annotations

import time
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.emit.spans import SpanData
from traceml_otel.wire.bounded_file import FileChange
from traceml_otel.wire.hang_record import STATE_HUNG, HangRecord, read_hang_record
from traceml_otel.wire.hang_verdict import HangVerdict, combine, hang_file_names, read_hang_records

POLL_S = 1.0
MAX_STACKS_CHARS = 16_000
GATHER_S = 5.0
"""After this rank's hang record, how long its span waits for the other ranks' records (the verdict)."""
MAX_VERDICT_CHARS = 4_000
MAX_RANKS_LISTED = 64


class HangState:
    """What the live metric reads: progress time lost and the phase, or 0 when not hung."""

    def __init__(self) -> None:
        self.record: HangRecord | None = None

    def stalled(self) -> tuple[float, str]:
        """(seconds without progress, phase) now; ``(0.0, "none")`` when this rank is not hung."""
        record = self.record
        if record is None or record.state != STATE_HUNG:
            return 0.0, "none"
        return max(0.0, time.time() - record.written_at + record.stalled_s), record.phase


def verdict_attributes(verdict: HangVerdict, rank: int) -> dict[str, object]:
    """The verdict over every rank as attributes of one rank's ``traceml.hang`` span (bounded)."""
    attributes: dict[str, object] = {
        c.ATTR_HANG_VERDICT: verdict.sentence[:MAX_VERDICT_CHARS],
        c.ATTR_HANG_CULPRIT: rank in verdict.culprits,
        c.ATTR_HANG_CULPRIT_RANKS: list(verdict.culprits[:MAX_RANKS_LISTED]),
        c.ATTR_HANG_WAITING_RANKS: list(verdict.waiting[:MAX_RANKS_LISTED]),
    }
    if verdict.location:
        attributes[c.ATTR_HANG_CULPRIT_LOCATION] = verdict.location
    return attributes


def hang_span(record: HangRecord, run_id: str, verdict: HangVerdict | None = None) -> SpanData:
    """The ``traceml.hang`` span of a record: from the last progress to when the hang was written,
    with the verdict over every rank when one was reached."""
    end_ns = int(record.written_at * 1e9)
    start_ns = end_ns - int(record.stalled_s * 1e9)
    main = next((t for t in record.threads if t.main), None)
    stack = "\n".join(f"{f.file}:{f.line} in {f.function}: {f.code}" for f in (main.frames if main else ()))
    call = record.collective
    attributes: dict[str, object] = {
        c.ATTR_RUN_ID: run_id, c.ATTR_RANK: record.rank, c.ATTR_STEP: record.step,
        c.ATTR_PHASE_NAME: record.phase, c.ATTR_HANG_STALLED: round(record.stalled_s, 3),
        c.ATTR_HANG_STACKS: stack[-MAX_STACKS_CHARS:],
    }
    if record.location is not None:
        attributes[c.ATTR_HANG_LOCATION] = f"{record.location.file}:{record.location.line}"
        attributes[c.ATTR_HANG_CODE] = record.location.code
    if call is not None:
        attributes[c.ATTR_HANG_COLLECTIVE] = f"{call.kind} #{call.seq} group {call.group} ({call.source})"
    if verdict is not None:
        attributes.update(verdict_attributes(verdict, record.rank))
    trace_id = c.step_trace_id(run_id, record.step)
    span_id = (trace_id ^ (0x48414E47 << 32) ^ record.rank) & ((1 << 64) - 1) or 1
    return SpanData(c.SPAN_HANG, trace_id, span_id, None, start_ns, end_ns, attributes, error="hang")


class HangRecordWatch:
    """Watches one rank's ``rank-R.hang.json``; :meth:`poll` returns a span for a new hang."""

    def __init__(self, run_dir: Path, rank: int, run_id: str, poll_s: float = POLL_S,
                 gather_s: float = GATHER_S) -> None:
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.gather_s = gather_s
        self.path = self.run_dir / c.hang_file_name(rank)
        self.run_id = run_id
        self.state = HangState()
        self._own = FileChange(self.path)
        self._spanned: float | None = None
        self._pending: HangRecord | None = None
        self._pending_since = 0.0
        self._next = 0.0

    def poll(self, force: bool = False) -> SpanData | None:
        """Re-read the record when it changed (at most every ``poll_s`` unless ``force``); a span
        for each new hang, once the other ranks' records are in (or ``gather_s`` passed, or
        ``force``)."""
        now = time.monotonic()
        if now < self._next and not force:
            return None
        self._next = now + self.poll_s
        self._read_own(now)
        record = self._pending
        if record is None:
            return None
        gathering = now - self._pending_since < self.gather_s
        if not force and gathering and self._ranks_recorded() < record.world_size:
            return None
        self._pending = None
        return hang_span(record, self.run_id, self._verdict(record))

    def _read_own(self, now: float) -> None:
        if not self._own.changed():
            return
        try:
            record = read_hang_record(self.path)
        except ValueError:
            return
        self.state.record = record
        if record.state == STATE_HUNG and record.detected_at != self._spanned:
            self._spanned = record.detected_at
            self._pending, self._pending_since = record, now

    def _ranks_recorded(self) -> int:
        """Ranks with a ``rank-R.hang.json`` in the run folder (one listing)."""
        try:
            names = hang_file_names(self.run_dir)
        except OSError:
            return 0
        return sum(1 for name in names if c.rank_of_file(name, c.hang_file_name) is not None)

    def _verdict(self, own: HangRecord) -> HangVerdict | None:
        """The verdict over the hung ranks' records (this rank's own as it was when spanned)."""
        records, _problems = read_hang_records(self.run_dir)  # bounded; an unreadable record is left out
        others = [r for r in records if r.rank != own.rank]
        return combine([own, *others], own.world_size)
