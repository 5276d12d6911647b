"""``rank-R.handoff.json``: the trainer's own word on what it handed its emitter, when the emitter
did not report back at shutdown (it died, or was stopped or hung).

The emitter writes ``rank-R.export.json`` as it goes; a dead or stopped emitter leaves that file
stale. The trainer knows what it traced and handed over, and how the emitter ended, so it writes
this record; :func:`traceml_otel.wire.export_stats.read_export_stats` folds it into the rank's
statistics (``emitter_lost``, ``steps_traced``), so the account and the diagnosis name the loss.
An emitter that finishes later (it was only stopped) writes final statistics, which then win.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from traceml_otel.contract import handoff_file_name
from traceml_otel.wire._json import RecordError, as_float, as_int, as_str, read_json_object, write_atomically

HANDOFF_VERSION = 1


@dataclass(frozen=True, slots=True)
class Handoff:
    """What one rank's trainer handed its emitter, and how the emitter ended (in words)."""

    run_id: str
    rank: int
    steps_traced: int
    """Steps the trainer closed."""
    steps_handed: int
    """Steps written whole into the emitter's pipe (it may not have read them all)."""
    steps_dropped: int
    """Steps never handed over (the pipe broke, or the backlog was given up)."""
    emitter: str
    """How the emitter ended, e.g. ``died (killed by SIGKILL)`` or ``stopped responding ...``."""
    end_status: str
    written_unix: float = 0.0


def write_handoff(run_dir: Path, handoff: Handoff) -> None:
    """Write ``rank-R.handoff.json`` atomically, never through a planted link (raises ``OSError``)."""
    data = {"handoff_version": HANDOFF_VERSION, **asdict(handoff), "written_unix": time.time()}
    write_atomically(run_dir / handoff_file_name(handoff.rank), json.dumps(data, indent=2) + "\n")


def read_handoff(run_dir: Path, rank: int) -> Handoff | None:
    """The rank's handoff record, or ``None`` when there is none.

    Raises:
        RecordError: the file exists but is not a readable handoff record.
    """
    path = run_dir / handoff_file_name(rank)
    if not path.exists() and not path.is_symlink():
        return None
    data = read_json_object(path, max_bytes=64 * 1024)
    counts = [as_int(data.get(name)) for name in ("rank", "steps_traced", "steps_handed", "steps_dropped")]
    if any(n is None or n < 0 for n in counts) or counts[0] != rank:
        raise RecordError(f"{path}: not a handoff record (counts missing or negative)")
    return Handoff(
        run_id=as_str(data.get("run_id"), 512) or "",
        rank=rank,
        steps_traced=counts[1] or 0,
        steps_handed=counts[2] or 0,
        steps_dropped=counts[3] or 0,
        emitter=as_str(data.get("emitter"), 500) or "ended",
        end_status=as_str(data.get("end_status"), 500) or "",
        written_unix=as_float(data.get("written_unix")) or 0.0,
    )
