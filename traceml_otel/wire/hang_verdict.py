"""One verdict from the ranks' hang records: who is stuck, where, and who waits for it.

Each rank's watchdog writes ``rank-R.hang.json`` (:mod:`traceml_otel.wire.hang_record`). A rank
that waits in collective N of process group G is not the problem: the problem is the rank that
never entered collective N of G (its count for G is below N), or entered a different collective
there (another kind, or the same kind from another call site). Those ranks are the culprits; each
is named with the ``file:line`` where its training thread is, and what it was doing. When every
rank waits in the same collective, no rank is missing from it, and the verdict says so.

Pure combination of records, shared by its three readers (one definition): the launcher's live hang
monitor, each rank's emitter (the verdict on its ``traceml.hang`` span, for any OTLP backend) and
``traceml analyze`` (the ``HANG`` finding, :mod:`traceml_otel.analyze.hang`).
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.contract import hang_file_name, hang_traceback_file_name, rank_of_file
from traceml_otel.sanitize import strip_control
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.bounded_file import open_regular
from traceml_otel.wire.hang_record import (
    SOURCE_FAULTHANDLER,
    STATE_HUNG,
    HangRecord,
    parse_faulthandler,
    read_hang_record,
)

MAX_RECORDS = 4096
"""Hang records read from one run folder (more are counted, not read)."""
MAX_NAMED = 8
"""Culprit and waiting ranks named in a sentence; more are counted."""

MAX_TRACEBACK_BYTES = 256 * 1024
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/traceml_otel/", "<frozen")


@dataclass(frozen=True, slots=True)
class HangVerdict:
    """The combined verdict: culprit ranks, waiting ranks, and the sentence that says it."""

    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    sentence: str
    location: str
    """``file:line`` of the first culprit (empty when no culprit is known)."""
    mismatch: bool = False
    missing: tuple[int, ...] = ()
    """Ranks of the world that wrote no record at all."""


def hang_file_names(run_dir: Path) -> list[str]:
    """Names of the hang records and faulthandler dumps in ``run_dir`` (bounded)."""
    names = sorted(entry.name for entry in os.scandir(run_dir)
                   if entry.name.endswith((".hang.json", ".hang-traceback.txt")))
    return names[:2 * MAX_RECORDS]


def read_hang_records(run_dir: Path) -> tuple[list[HangRecord], list[str]]:
    """Every rank's hang record in ``run_dir`` (bounded); problems are returned, never raised.

    A rank whose watchdog thread could not run (C code holding the GIL) has no ``rank-R.hang.json``
    but a ``rank-R.hang-traceback.txt`` from ``faulthandler``; it is read as a record with phase
    ``unknown``.
    """
    records: dict[int, HangRecord] = {}
    problems: list[str] = []
    try:
        names = hang_file_names(run_dir)
    except OSError as error:
        return [], [f"{run_dir}: cannot list hang records ({type(error).__name__})"]
    for name in names:
        rank = rank_of_file(name, hang_file_name)
        if rank is None:
            continue
        try:
            records[rank] = read_hang_record(Path(run_dir) / name)
        except (RecordError, ValueError) as error:
            problems.append(f"{name}: {error}")
    for name in names:
        rank = rank_of_file(name, hang_traceback_file_name)
        if rank is None or rank in records:
            continue
        record = faulthandler_record(Path(run_dir) / name, rank)
        if record is not None:
            records[rank] = record
    return [records[rank] for rank in sorted(records)], problems


def faulthandler_record(path: Path, rank: int) -> HangRecord | None:
    """A hang record from a ``faulthandler`` dump (read bounded; ``None`` when empty or unreadable)."""
    try:  # a regular file only, never blocking (a FIFO planted there is refused), its last 256 KiB
        with open(open_regular(path, follow_links=False), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - MAX_TRACEBACK_BYTES))
            text = handle.read(MAX_TRACEBACK_BYTES).decode("utf-8", "replace")
            modified = os.fstat(handle.fileno()).st_mtime
    except OSError:  # RefusedFile included
        return None
    threads = parse_faulthandler(text)
    main = next((t for t in threads if t.main), threads[0] if threads else None)
    if main is None:
        return None
    own = [f for f in main.frames if not any(part in f.file for part in _LIBRARY_PARTS)]
    location = own[-1] if own else main.frames[-1] if main.frames else None
    return HangRecord(
        rank=rank, world_size=1, run_id="", state=STATE_HUNG, stalled_s=0.0, timeout_s=0.0, step=0,
        in_step=False, phase="unknown", location=location, threads=threads, written_at=modified,
        source=SOURCE_FAULTHANDLER, note="holding the GIL (its watchdog thread could not run)",
    )


def _code(record: HangRecord) -> str:
    frame = record.location
    if frame is None:
        return ""
    code = frame.code
    if not code and record.source == SOURCE_FAULTHANDLER and frame.file.endswith(".py"):
        code = linecache.getline(frame.file, frame.line)  # a faulthandler dump has no source lines
    shown = code.split("  #", 1)[0].strip() or f"{frame.function}()"
    return strip_control(shown)[:80]


def _where(record: HangRecord) -> str:
    return strip_control(record.location.where()) if record.location is not None else "an unknown place"


def _doing(record: HangRecord) -> str:
    """``in step 40 before its forward``, ``between steps 5 and 6``, ``in the backward of step 3``."""
    step = record.step
    if record.phase == "input":
        return f"fetching input in step {step}" if record.in_step else f"fetching the input of step {step}"
    if record.phase in ("forward", "backward", "optimizer"):
        return f"in the {record.phase} of step {step}"
    if record.phase == "step":
        done = [p for p in record.phases_done if p in ("forward", "backward", "optimizer")]
        return f"in step {step} " + (f"after its {done[-1]}" if done else "before its forward")
    if record.phase == "collective" and record.collective is not None:
        return f"in step {step}" if record.in_step else f"after step {step - 1}"
    if record.phase == "between steps":
        return f"between steps {step - 1} and {step}" if step > 0 else "before its first step"
    if record.source == SOURCE_FAULTHANDLER:
        return "(step unknown: faulthandler dump)"
    return f"at step {step}"


def _collective_text(record: HangRecord) -> str:
    call = record.collective
    if call is None:
        return ""
    what = f"{call.kind} #{call.seq}"
    if call.group != "default":
        what += f" of group {strip_control(call.group)[:40]}"
    if call.source == "ddp":
        what += " (DDP gradient sync)"
    return what


def _whose(record: HangRecord) -> str:
    """``user``, or the installed package the frame belongs to (``transformers``)."""
    file = record.location.file if record.location is not None else ""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in file:
            package = file.split(marker, 1)[1].split("/", 1)[0]
            return strip_control(package.removesuffix(".py"))[:40] or "library"
    return "user"


def describe_culprit(record: HangRecord) -> str:
    """``rank 1 is stuck in user code at train.py:23 (time.sleep(3600)) in step 40 before its forward``."""
    code = _code(record)
    code_text = f" ({code})" if code else ""
    if record.collective is not None:
        what = _collective_text(record)
        return f"rank {record.rank} entered {what} at {_where(record)}{code_text} {_doing(record)}"
    inside = f" {strip_control(record.note)[:80]}" if record.note else ""
    where = f"{_where(record)}{code_text}{inside}"
    return f"rank {record.rank} is stuck in {_whose(record)} code at {where} {_doing(record)}"


def describe_waiting(record: HangRecord) -> str:
    """``rank 0 waits in all_reduce #81 (DDP gradient sync) for 62 s``."""
    call = record.collective
    if call is None:
        return f"rank {record.rank} has made no progress for {record.stalled_s:.0f} s at {_where(record)}"
    return f"rank {record.rank} waits in {_collective_text(record)} for {call.waited_s:.0f} s"


def named_ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED])
    more = f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


def _culprits(hung: Sequence[HangRecord]) -> tuple[list[HangRecord], list[HangRecord], bool]:
    """Split the hung ranks into culprits and waiters (and whether a collective mismatch was seen)."""
    waiting = [r for r in hung if r.collective is not None]
    if not waiting:
        return list(hung), [], False
    # The collective the most ranks wait in is the one the culprits did not join.
    votes: dict[tuple[str, int], list[HangRecord]] = {}
    for record in waiting:
        call = record.collective
        assert call is not None
        votes.setdefault((call.group, call.seq), []).append(record)
    (group, seq), in_it = max(votes.items(), key=lambda item: (len(item[1]), -item[0][1]))
    signature = {(r.collective.kind, r.collective.source) for r in in_it if r.collective is not None}
    mismatch = len(signature) > 1
    culprits: list[HangRecord] = []
    waiters: list[HangRecord] = []
    if mismatch:  # same sequence number, different calls: the minority entered the wrong one
        by_call: dict[tuple[str, str], list[HangRecord]] = {}
        for record in in_it:
            assert record.collective is not None
            by_call.setdefault((record.collective.kind, record.collective.source), []).append(record)
        sizes = sorted((len(v) for v in by_call.values()), reverse=True)
        majority = max(by_call.values(), key=len) if sizes[0] > sizes[1] else []
        culprits += [r for r in in_it if r not in majority]  # a tie: every side is named
        waiters += majority
    else:
        waiters += in_it
    for record in hung:
        if record in in_it:
            continue
        if record.entered.get(group, 0) < seq or record.collective is None:
            culprits.append(record)  # never entered collective #seq of the group
        else:
            culprits.append(record)  # entered a different collective there
            mismatch = True
    return culprits, waiters, mismatch


def combine(records: Iterable[HangRecord], world_size: int | None = None) -> HangVerdict | None:
    """The verdict over the ranks' records still ``hung``; ``None`` when no rank is hung."""
    hung = sorted((r for r in records if r.state == STATE_HUNG), key=lambda r: r.rank)
    if not hung:
        return None
    world = world_size or max(r.world_size for r in hung)
    seen = {r.rank for r in hung}
    missing = tuple(rank for rank in range(min(world, MAX_RECORDS)) if rank not in seen)
    culprits, waiters, mismatch = _culprits(hung)
    parts: list[str] = []
    if culprits:
        parts += [describe_culprit(r) for r in culprits[:MAX_NAMED]]
        if len(culprits) > MAX_NAMED:
            parts.append(f"{len(culprits) - MAX_NAMED} more ranks are stuck elsewhere")
    elif waiters:
        first = waiters[0]
        parts.append(f"every rank that reported waits in {_collective_text(first)}: no reporting rank is "
                     "missing from it")
    if missing and waiters:
        parts.append(f"{named_ranks(missing)} wrote no hang record "
                     "(never entered it, died, or cannot report)")
    if waiters:
        shown = [describe_waiting(r) for r in waiters[:3]]
        rest = len(waiters) - len(shown)
        parts.append("; ".join(shown) + (f" (and {rest} more ranks wait there)" if rest > 0 else ""))
    sentence = "; ".join(parts)
    if mismatch:
        sentence = "collective mismatch: " + sentence
    location = _where(culprits[0]) if culprits and culprits[0].location is not None else ""
    return HangVerdict(
        culprits=tuple(r.rank for r in culprits), waiting=tuple(r.rank for r in waiters), sentence=sentence,
        location=location, mismatch=mismatch, missing=missing if waiters else (),
    )
