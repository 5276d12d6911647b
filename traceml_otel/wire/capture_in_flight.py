"""A capture in flight: ``rank-R.capture-running.A.json``, there from a capture's arming to its profiler's
stop (A: the attempt, torchrun's restart count, so a restarted attempt never overwrites an earlier one's).

The rank's poller writes it when it arms a capture and removes it once the profiler has stopped (or the
capture did not start), and at a clean shutdown. A rank that dies in between (a crash inside
``torch.profiler``, which telemetry cannot catch) leaves it behind, and that is its use:

- the analyzer says the rank died with a capture armed or running (``analyze/captures.py``), so a crash
  our profiler may have caused is never billed to the user's code in silence;
- a restarted attempt of the run (``TORCHELASTIC_RESTART_COUNT`` higher than the marker's) takes no
  automatic capture (``capture/profiler_capture.py``): what may have crashed it once is not repeated.

Standard library only, like the rest of :mod:`traceml_otel.wire`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from traceml_otel.wire._json import RecordError, as_float, as_int, as_str, read_json_object, write_atomically
from traceml_otel.wire.capture_record import numbered_files

MAX_BYTES = 4 << 10
_NAME = re.compile(r"^rank-(\d{1,7})\.capture-running\.(\d{1,5})\.json$")


def in_flight_file_name(rank: int, restart: int = 0) -> str:
    """``rank-R.capture-running.A.json`` (A: the attempt's restart count)."""
    return f"rank-{rank}.capture-running.{restart}.json"


@dataclass(frozen=True, slots=True)
class CaptureInFlight:
    """One rank's capture between its arming and its profiler's stop."""

    rank: int
    request: str
    """The request's id."""
    reason: str
    with_stack: bool
    """Whether the profiler records Python stacks (its Python tracer: the part most often seen to crash)."""
    armed_unix: float
    restart: int = 0
    """The attempt (``TORCHELASTIC_RESTART_COUNT``) that armed it."""
    run_id: str = ""
    at_step: int | None = None
    """The step the capture was armed to start at (a periodic spike's predicted one), when known."""
    running: bool = False
    """Whether the poller saw the profiler running (it looks every ``TRACEML_CAPTURE_POLL_S``; a crash
    in the profiler's start comes before it can)."""


def write_in_flight(run_dir: Path, marker: CaptureInFlight) -> None:
    """Write the marker atomically (raises ``OSError``)."""
    text = json.dumps({"version": 1, **asdict(marker)})
    write_atomically(run_dir / in_flight_file_name(marker.rank, marker.restart), text)


def read_in_flight(run_dir: Path, limit: int = 4096) -> list[CaptureInFlight]:
    """The markers left in ``run_dir`` (by rank, then attempt; at most ``limit``; unreadable ones left
    out)."""
    try:
        found = numbered_files(run_dir, _NAME, limit)
    except OSError:
        return []
    markers = []
    for (rank, restart), path in found:
        try:
            raw = read_json_object(path, MAX_BYTES)
        except RecordError:
            continue
        markers.append(CaptureInFlight(
            rank=rank, request=as_str(raw.get("request"), 96) or "",
            reason=as_str(raw.get("reason"), 32) or "", with_stack=raw.get("with_stack") is True,
            armed_unix=as_float(raw.get("armed_unix")) or 0.0, restart=restart,
            run_id=as_str(raw.get("run_id"), 256) or "",
            at_step=as_int(raw.get("at_step")), running=raw.get("running") is True))
    return markers
