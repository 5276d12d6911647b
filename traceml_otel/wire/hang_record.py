"""``rank-R.hang.json``: what one rank was doing when it stopped making progress.

The rank's hang watchdog (:mod:`traceml_otel.capture.watchdog`) writes it atomically into the run
folder as soon as a hang is detected (so it survives a later SIGKILL), rewrites it while the hang
lasts, and marks it ``resolved`` when steps move again. The launcher's hang monitor and the
analyzer read it (:mod:`traceml_otel.wire.hang_verdict` combines the ranks' records into one verdict).

Every field is bounded: at most :data:`MAX_THREADS` threads of :data:`MAX_FRAMES` frames each, and
strings cut at :data:`MAX_TEXT` characters (function names at 100), and at most
:data:`MAX_EARLIER_EPISODES` earlier stall episodes (at most about 300 bytes each; beyond them a count and
their total seconds), so a record stays under the 1 MiB read limit (about 720 KB at worst; a few KiB
usually).

The record describes the current (or last) stall. A rank that stalled, recovered and stalls again
keeps its earlier resolved stalls in ``earlier`` (version 2; a version-1 record has none and reads as
such, and a version-1 reader ignores the field), so the time accounting counts every declared stall.
Each episode keeps where the training thread was stuck (``where``, ``train.py:23``; absent from records of
earlier releases, read as unknown), so a report names each stall's own place, not the last one's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceml_otel.contract import hang_file_name
from traceml_otel.wire._json import (
    RecordError,
    as_float,
    as_int,
    as_str,
    as_version,
    read_json_object,
    write_atomically,
)

HANG_RECORD_VERSION = 2
"""2: ``earlier`` and ``earlier_left_out``/``earlier_left_out_s`` (earlier stall episodes) added."""
MAX_THREADS = 32
MAX_FRAMES = 40
MAX_TEXT = 200
MAX_GROUPS = 16
MAX_WHERE = 120
"""Characters kept of an episode's ``file:line``."""
MAX_EARLIER_EPISODES = 64
"""Earlier stall episodes kept in a record (the most recent); older ones are counted, not listed."""

STATE_HUNG = "hung"
STATE_RESOLVED = "resolved"

SOURCE_WATCHDOG = "watchdog"
SOURCE_FAULTHANDLER = "faulthandler"


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One frame of a Python stack: file, line, function and the source line (if readable)."""

    file: str
    line: int
    function: str
    code: str = ""

    def where(self) -> str:
        """``train.py:23``: the file's base name and the line."""
        return f"{Path(self.file).name}:{self.line}"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's Python stack, outermost frame first."""

    name: str
    main: bool
    frames: tuple[StackFrame, ...]


@dataclass(frozen=True, slots=True)
class OpenCollective:
    """A collective this rank entered and that had not completed: call ``seq`` of ``group``."""

    kind: str
    group: str
    seq: int
    source: str
    """``ddp`` (DDP's gradient buckets) or ``api`` (a ``torch.distributed`` call)."""
    waited_s: float


@dataclass(frozen=True, slots=True)
class StallEpisode:
    """An earlier, resolved stall of the rank: from its last progress for ``stalled_s`` seconds."""

    progress_at: float
    """The last progress before the stall (Unix seconds)."""
    stalled_s: float
    step: int
    """The step it stalled in (``in_step``), else the next one."""
    in_step: bool
    phase: str = ""
    where: str = ""
    """``train.py:23``: where the training thread was stuck (its record's location); empty when unknown."""

    @property
    def resolved_at(self) -> float:
        """When steps moved again."""
        return self.progress_at + self.stalled_s


@dataclass(frozen=True, slots=True)
class HangRecord:
    """One rank's hang: its progress state and every thread's stack when it was seen stalled."""

    rank: int
    world_size: int
    run_id: str
    state: str
    """``hung`` while no progress is seen, ``resolved`` once steps moved again."""
    stalled_s: float
    """Seconds without progress when the record was written."""
    timeout_s: float
    """The hang timeout in force (see ``TRACEML_HANG_TIMEOUT_S``)."""
    step: int
    """The step in progress (``in_step``), else the next one."""
    in_step: bool
    phase: str
    """``input``, ``forward``, ``backward``, ``optimizer``, ``collective``, ``step`` (user code inside
    the step), ``between steps``, or ``unknown`` (faulthandler dump)."""
    phases_done: tuple[str, ...] = ()
    """Phases the step in progress had completed, in order (distinct names)."""
    collective: OpenCollective | None = None
    """The collective the rank waits in (the oldest open one), if any."""
    entered: dict[str, int] = field(default_factory=dict)
    """Per process group: how many collectives this rank had entered (the last sequence number)."""
    location: StackFrame | None = None
    """Innermost frame of the training thread in the program's own code."""
    innermost: StackFrame | None = None
    """Innermost frame of the training thread (often inside torch or the standard library)."""
    threads: tuple[ThreadStack, ...] = ()
    host: str = ""
    pid: int = 0
    detected_at: float = 0.0
    resolved_at: float | None = None
    written_at: float = 0.0
    source: str = SOURCE_WATCHDOG
    note: str = ""
    """Where the culprit frame is when not on the training thread (``in DataLoader worker pid N``)."""
    flight_recorder: str = ""
    """What became of PyTorch's flight recorder dump (``flight recorder in rank-R.flight-recorder.json``)."""
    earlier: tuple[StallEpisode, ...] = ()
    """The rank's earlier resolved stalls in this process, oldest first (at most
    :data:`MAX_EARLIER_EPISODES`, the most recent)."""
    earlier_left_out: int = 0
    """Earlier stalls beyond the bound: how many were left out of ``earlier`` ..."""
    earlier_left_out_s: float = 0.0
    """... and their seconds in total (still counted as stalled time)."""
    version: int = HANG_RECORD_VERSION


def bounded_episodes(
    episodes: tuple[StallEpisode, ...], left_out: int = 0, left_out_s: float = 0.0,
) -> tuple[tuple[StallEpisode, ...], int, float]:
    """``episodes`` cut to the most recent :data:`MAX_EARLIER_EPISODES`, the older ones added to the
    count and seconds left out (nothing is lost without being counted)."""
    cut = max(0, len(episodes) - MAX_EARLIER_EPISODES)
    if not cut:
        return episodes, left_out, left_out_s
    return episodes[cut:], left_out + cut, left_out_s + sum(e.stalled_s for e in episodes[:cut])


def _text(value: str) -> str:
    return value[:MAX_TEXT]


def _frame_json(frame: StackFrame | None) -> dict[str, Any] | None:
    if frame is None:
        return None
    return {"file": _text(frame.file), "line": frame.line, "function": frame.function[:100],
            "code": _text(frame.code)}


def _episode_json(episode: StallEpisode) -> dict[str, Any]:
    return {"progress_at": round(episode.progress_at, 3), "stalled_s": round(episode.stalled_s, 3),
            "step": episode.step, "in_step": episode.in_step, "phase": episode.phase[:40],
            "where": _text(episode.where)[:MAX_WHERE]}


def encode_hang_record(record: HangRecord) -> str:
    """The record as compact JSON (bounded as the module docstring says)."""
    collective = record.collective
    earlier, left_out, left_out_s = bounded_episodes(record.earlier, record.earlier_left_out,
                                                     record.earlier_left_out_s)
    value = {
        "version": record.version, "rank": record.rank, "world_size": record.world_size,
        "run_id": _text(record.run_id), "state": record.state, "stalled_s": round(record.stalled_s, 3),
        "timeout_s": round(record.timeout_s, 3), "step": record.step, "in_step": record.in_step,
        "phase": record.phase, "phases_done": list(record.phases_done)[:8],
        "collective": None if collective is None else {
            "kind": collective.kind, "group": _text(collective.group), "seq": collective.seq,
            "source": collective.source, "waited_s": round(collective.waited_s, 3)},
        "entered": {_text(k): v for k, v in list(record.entered.items())[:MAX_GROUPS]},
        "location": _frame_json(record.location), "innermost": _frame_json(record.innermost),
        "threads": [
            {"name": _text(t.name), "main": t.main,
             "frames": [_frame_json(f) for f in t.frames[-MAX_FRAMES:]]}
            for t in record.threads[:MAX_THREADS]
        ],
        "host": _text(record.host), "pid": record.pid, "detected_at": record.detected_at,
        "resolved_at": record.resolved_at, "written_at": record.written_at, "source": record.source,
        "note": _text(record.note), "flight_recorder": _text(record.flight_recorder),
        "earlier": [_episode_json(e) for e in earlier],
        "earlier_left_out": left_out, "earlier_left_out_s": round(left_out_s, 3),
    }
    return json.dumps(value, separators=(",", ":"))


def write_hang_record(run_dir: Path, record: HangRecord) -> Path:
    """Write ``rank-R.hang.json`` atomically; raises ``OSError`` (full or read-only disk)."""
    path = Path(run_dir) / hang_file_name(record.rank)
    write_atomically(path, encode_hang_record(record))
    return path


def _frame(raw: object) -> StackFrame | None:
    if not isinstance(raw, dict):
        return None
    file, line = as_str(raw.get("file"), MAX_TEXT), as_int(raw.get("line"))
    if file is None or line is None:
        return None
    function = as_str(raw.get("function"), MAX_TEXT) or "?"
    return StackFrame(file, line, function, as_str(raw.get("code"), MAX_TEXT) or "")


def _collective(raw: object) -> OpenCollective | None:
    if not isinstance(raw, dict):
        return None
    seq = as_int(raw.get("seq"))
    if seq is None:
        return None
    return OpenCollective(
        kind=as_str(raw.get("kind"), 40) or "?", group=as_str(raw.get("group"), MAX_TEXT) or "?", seq=seq,
        source=as_str(raw.get("source"), 20) or "", waited_s=as_float(raw.get("waited_s")) or 0.0,
    )


def _episode(raw: object) -> StallEpisode | None:
    if not isinstance(raw, dict):
        return None
    since, stalled = as_float(raw.get("progress_at")), as_float(raw.get("stalled_s"))
    if since is None or stalled is None or stalled <= 0:
        return None
    return StallEpisode(since, stalled, as_int(raw.get("step")) or 0, raw.get("in_step") is True,
                        as_str(raw.get("phase"), 40) or "", as_str(raw.get("where"), MAX_WHERE) or "")


def _episodes(value: dict[str, Any]) -> tuple[tuple[StallEpisode, ...], int, float]:
    """The earlier episodes (absent in version 1), bounded as written: a longer list's older entries
    are counted (:func:`bounded_episodes`)."""
    raw = value.get("earlier") if isinstance(value.get("earlier"), list) else []
    episodes = tuple(e for e in map(_episode, raw) if e is not None)
    return bounded_episodes(episodes, max(0, as_int(value.get("earlier_left_out")) or 0),
                            max(0.0, as_float(value.get("earlier_left_out_s")) or 0.0))


def decode_hang_record(value: dict[str, Any]) -> HangRecord:
    """A record from its JSON object; raises :class:`RecordError` when the rank is missing."""
    rank = as_int(value.get("rank"))
    if rank is None or rank < 0:
        raise RecordError("a hang record without a rank")
    threads_raw = value.get("threads") if isinstance(value.get("threads"), list) else []
    threads = []
    for raw in threads_raw[:MAX_THREADS]:
        if isinstance(raw, dict) and isinstance(raw.get("frames"), list):
            frames = tuple(f for f in (_frame(x) for x in raw["frames"][-MAX_FRAMES:]) if f is not None)
            name = as_str(raw.get("name"), MAX_TEXT) or "?"
            threads.append(ThreadStack(name, raw.get("main") is True, frames))
    entered_raw = value.get("entered") if isinstance(value.get("entered"), dict) else {}
    entered = {str(k)[:MAX_TEXT]: n for k, v in list(entered_raw.items())[:MAX_GROUPS]
               if (n := as_int(v)) is not None}
    phases = value.get("phases_done") if isinstance(value.get("phases_done"), list) else []
    earlier, left_out, left_out_s = _episodes(value)
    return HangRecord(
        rank=rank, world_size=as_int(value.get("world_size")) or 1,
        run_id=as_str(value.get("run_id"), MAX_TEXT) or "",
        state=STATE_RESOLVED if value.get("state") == STATE_RESOLVED else STATE_HUNG,
        stalled_s=as_float(value.get("stalled_s")) or 0.0, timeout_s=as_float(value.get("timeout_s")) or 0.0,
        step=as_int(value.get("step")) or 0, in_step=value.get("in_step") is True,
        phase=as_str(value.get("phase"), 40) or "unknown",
        phases_done=tuple(p[:40] for p in phases[:8] if isinstance(p, str)),
        collective=_collective(value.get("collective")), entered=entered,
        location=_frame(value.get("location")), innermost=_frame(value.get("innermost")),
        threads=tuple(threads),
        host=as_str(value.get("host"), MAX_TEXT) or "", pid=as_int(value.get("pid")) or 0,
        detected_at=as_float(value.get("detected_at")) or 0.0, resolved_at=as_float(value.get("resolved_at")),
        written_at=as_float(value.get("written_at")) or 0.0,
        source=as_str(value.get("source"), 20) or SOURCE_WATCHDOG,
        note=as_str(value.get("note"), MAX_TEXT) or "",
        flight_recorder=as_str(value.get("flight_recorder"), MAX_TEXT) or "",
        earlier=earlier, earlier_left_out=left_out, earlier_left_out_s=left_out_s,
        version=as_version(value.get("version")) or 1,
    )


def read_hang_record(path: Path) -> HangRecord:
    """Read one ``rank-R.hang.json``.

    Raises:
        RecordError: unreadable or not JSON (a subclass of ``ValueError``); ValueError: no rank in it.
    """
    return decode_hang_record(read_json_object(path))


def parse_faulthandler(text: str, name_prefix: str = "") -> tuple[ThreadStack, ...]:
    """The threads of a ``faulthandler`` dump (the last one when there are several), outermost frame first.

    Lines look like ``Thread 0x7f.. (most recent call first):`` (``Current thread ...`` for the thread
    that was running) followed by ``  File "x.py", line 49 in fetch``. A thread with a ``<module>``
    frame, or the current one, is marked ``main``.
    """
    threads: list[ThreadStack] = []
    name = ""
    current = False
    frames: list[StackFrame] = []

    def close() -> None:
        if name and frames:
            ordered = tuple(reversed(frames[:MAX_FRAMES]))
            main = current or any(f.function == "<module>" for f in ordered)
            threads.append(ThreadStack(name, main, ordered))

    for line in text.splitlines()[-4000:]:
        stripped = line.strip()
        if stripped.startswith("Timeout ("):  # dump_traceback_later's header: a new dump begins
            close()
            threads, name, frames, current = [], "", [], False
        elif stripped.startswith(("Thread 0x", "Current thread 0x")) and stripped.endswith("call first):"):
            close()
            if current:  # the block just closed ended a signal's dump: a new dump begins
                threads = []
            current = stripped.startswith("Current")
            name, frames = f"{name_prefix}{stripped.split(' (most recent', 1)[0]}", []
        elif stripped.startswith('File "') and name:
            file, _, rest = stripped[6:].partition('", line ')
            number, _, function = rest.partition(" in ")
            if number.strip().isdigit():
                frames.append(StackFrame(file[:MAX_TEXT], int(number), function.strip()[:MAX_TEXT] or "?"))
    close()
    return tuple(threads[-MAX_THREADS:])
