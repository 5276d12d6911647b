"""Deep captures' records in the run folder (``docs/captures.md``).

- :class:`CaptureRequest`: asks ranks for a ``torch.profiler`` capture. ``traceml capture`` writes the run's
  ``capture-request.json`` (every rank, or the ranks it names); a rank's emitter writes
  ``rank-R.capture-request.json`` when one of its triggers fires. Each rank's poller reads both (bounded).
- :class:`CaptureSummary`: what one capture found (``rank-R.capture-N.json``), beside its trace
  ``rank-R.capture-N.trace.json.gz`` (Chrome/Perfetto JSON, gzip).

Standard library only, like the rest of :mod:`traceml_otel.wire`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceml_otel.wire._json import RecordError, as_float, as_int, as_str, read_json_object, write_atomically

CAPTURE_VERSION = 1
REQUEST_FILE = "capture-request.json"
"""The run-wide on-demand request (``traceml capture``)."""
MAX_REQUEST_BYTES = 16 << 10
MAX_SUMMARY_BYTES = 256 << 10
MAX_ROWS = 12
MAX_TEXT = 300
MAX_REQUEST_STEPS = 50
REASONS = ("spike", "drift", "residual", "straggler", "on_demand")
"""Why a capture was taken: the automatic triggers (``emit/capture_triggers.py``) and ``traceml capture``."""
_SUMMARY_NAME = re.compile(r"^rank-(\d{1,7})\.capture-(\d{1,5})\.json$")


def request_file_name(rank: int) -> str:
    """One rank's trigger request, written by its emitter."""
    return f"rank-{rank}.capture-request.json"


def demand_file_name(rank: int) -> str:
    """One rank's on-demand request from its metrics port (``POST /capture``), written by its emitter."""
    return f"rank-{rank}.capture-demand.json"


def trace_file_name(rank: int, index: int) -> str:
    """The ``index``-th capture's trace on ``rank`` (from 1)."""
    return f"rank-{rank}.capture-{index}.trace.json.gz"


def summary_file_name(rank: int, index: int) -> str:
    """The ``index``-th capture's summary on ``rank`` (from 1)."""
    return f"rank-{rank}.capture-{index}.json"


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """A request for a capture: ``ranks`` empty means every rank."""

    id: str
    reason: str
    steps: int = 0
    """Steps to capture; 0: the rank's ``TRACEML_CAPTURE_STEPS``."""
    ranks: tuple[int, ...] = ()
    detail: str = ""
    """What fired, in words (``step 120: 0.91 s busy, 6.2 x the rank's p95 0.15 s``)."""
    at_step: int | None = None
    requested_unix: float = 0.0
    baseline_ms: float | None = None
    """The median busy step of the rank before the trigger fired (``None`` on demand)."""
    every: int | None = None
    """A periodic spike's period in steps: a rank past ``at_step`` moves it on by whole periods."""
    wasted_s: float = 0.0
    """The time the triggering anomaly has wasted on this rank so far, as its trigger measured it (the
    cost budget's second allowance, ``capture/capture_budget.py``)."""


def encode_request(request: CaptureRequest) -> str:
    """The request's JSON text."""
    return json.dumps({"version": CAPTURE_VERSION, **asdict(request)}, separators=(",", ":"))


def write_request(path: Path, request: CaptureRequest) -> None:
    """Replace the request file at ``path`` atomically (never through a link)."""
    write_atomically(path, encode_request(request))


def read_request(path: Path) -> CaptureRequest:
    """The request in ``path``, checked field by field; raises :class:`RecordError` when it is not one."""
    raw = read_json_object(path, MAX_REQUEST_BYTES)
    ident = as_str(raw.get("id"), 64)
    reason = as_str(raw.get("reason"), 32)
    if not ident or reason not in REASONS:
        raise RecordError(f"{path.name}: not a capture request (id and a reason among {', '.join(REASONS)})")
    steps = as_int(raw.get("steps")) or 0
    if not 0 <= steps <= MAX_REQUEST_STEPS:
        raise RecordError(f"{path.name}: steps must be 0..{MAX_REQUEST_STEPS}, not {steps}")
    ranks_raw = raw.get("ranks") or []
    if not isinstance(ranks_raw, list) or len(ranks_raw) > 4096:
        raise RecordError(f"{path.name}: ranks must be a list of at most 4096 ranks")
    ranks = tuple(r for r in (as_int(v) for v in ranks_raw) if r is not None and r >= 0)
    return CaptureRequest(id=ident, reason=reason, steps=steps, ranks=ranks,
                          detail=_clean(as_str(raw.get("detail"), MAX_TEXT) or ""),
                          at_step=as_int(raw.get("at_step")),
                          requested_unix=as_float(raw.get("requested_unix")) or 0.0,
                          baseline_ms=as_float(raw.get("baseline_ms")), every=_period(raw.get("every")),
                          wasted_s=max(0.0, min(as_float(raw.get("wasted_s")) or 0.0, 1e9)))


def _period(raw: object) -> int | None:
    value = as_int(raw)
    return value if value is not None and 0 < value <= 1_000_000 else None


def _clean(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class OpTime:
    """One operator (or runtime call) in a capture: its self time and where user code called it."""

    name: str
    self_cpu_us: float
    self_device_us: float = 0.0
    count: int = 0
    share: float = 0.0
    """Of all operators' self time on its clock (CPU, or the device for ``top_device``)."""
    frame: str = ""
    """The innermost frame of user code that called it (``train.py(88): step``), when stacks are on."""


@dataclass(frozen=True, slots=True)
class CaptureSummary:
    """What one capture found on one rank (``rank-R.capture-N.json``)."""

    run_id: str
    rank: int
    index: int
    reason: str
    detail: str = ""
    request_id: str = ""
    steps: tuple[int, ...] = ()
    step_ms: tuple[float, ...] = ()
    """The captured steps' wall time (profiler on)."""
    median_ms: float | None = None
    """The rank's median step before the capture (profiler off)."""
    top_cpu: tuple[OpTime, ...] = ()
    top_device: tuple[OpTime, ...] = ()
    frames: tuple[OpTime, ...] = ()
    """User-code functions by the self CPU time of the operators they called (stacks on): ``name`` is the
    function (``train.py(80): step``: file, the line it starts at, name), ``frame`` its costliest operator."""
    syncs: tuple[OpTime, ...] = ()
    """Host-device synchronisations (``aten::item``, ``aten::_local_scalar_dense``, ``cuda*Synchronize``)."""
    collectives: tuple[OpTime, ...] = ()
    trace_file: str = ""
    trace_bytes: int = 0
    export_s: float = 0.0
    activities: tuple[str, ...] = ("cpu",)
    with_stack: bool = False
    record_shapes: bool = False
    problem: str = ""
    """Why the trace or the summary is missing or partial (a cap reached, an export error)."""
    limits: dict[str, float] = field(default_factory=dict)
    finished_unix: float = 0.0
    started_unix: float = 0.0
    """Wall clock when the profiler started (before the first captured step)."""
    stopped_unix: float = 0.0
    """Wall clock when it stopped (after the last captured step)."""
    cost_s: float = 0.0
    """What the capture cost the training thread, at most: the profiler's start and stop, the captured
    steps' time over ``median_ms`` (their whole time without it) and the export's wall time
    (``traceml_otel/capture/capture_budget.py``)."""
    train_s: float = 0.0
    """The rank's training time (since its first step) when the capture started."""
    export_began_unix: float = 0.0
    """Wall clock when its export began (0: not recorded; the export then ran from ``stopped_unix``)."""
    export_deferred: bool = False
    """The export waited for the budget (or the end of training) instead of running at once."""
    export_after_training: bool = False
    """The export ran at the rank's shutdown, after its training: ``cost_s`` holds none of it."""
    version: int = CAPTURE_VERSION

    def label(self) -> str:
        """``rank-R.capture-N``."""
        return f"rank-{self.rank}.capture-{self.index}"


def write_summary(run_dir: Path, summary: CaptureSummary) -> None:
    """Write ``rank-R.capture-N.json`` atomically."""
    write_atomically(run_dir / summary_file_name(summary.rank, summary.index),
                     json.dumps(asdict(summary), separators=(",", ":")))


def _ops(raw: object) -> tuple[OpTime, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[:MAX_ROWS]:
        if isinstance(item, dict):
            out.append(OpTime(
                name=_clean(as_str(item.get("name"), MAX_TEXT) or "?"),
                self_cpu_us=as_float(item.get("self_cpu_us")) or 0.0,
                self_device_us=as_float(item.get("self_device_us")) or 0.0,
                count=as_int(item.get("count")) or 0, share=as_float(item.get("share")) or 0.0,
                frame=_clean(as_str(item.get("frame"), MAX_TEXT) or ""),
            ))
    return tuple(out)


def _floats(raw: object) -> tuple[float, ...]:
    return tuple(v for v in (as_float(x) for x in raw[:64]) if v is not None) if isinstance(raw, list) else ()


def decode_summary(raw: dict[str, Any]) -> CaptureSummary:
    """A summary from its JSON object, checked; raises :class:`RecordError` when it is not one."""
    rank, index = as_int(raw.get("rank")), as_int(raw.get("index"))
    if rank is None or index is None or as_int(raw.get("version")) != CAPTURE_VERSION:
        raise RecordError("not a capture summary of this version")
    raw_limits = raw.get("limits")
    limits: dict[Any, Any] = raw_limits if isinstance(raw_limits, dict) else {}
    return CaptureSummary(
        run_id=as_str(raw.get("run_id"), 200) or "", rank=rank, index=index,
        reason=as_str(raw.get("reason"), 32) or "", detail=_clean(as_str(raw.get("detail"), MAX_TEXT) or ""),
        request_id=as_str(raw.get("request_id"), 64) or "",
        steps=tuple(int(v) for v in _floats(raw.get("steps"))), step_ms=_floats(raw.get("step_ms")),
        median_ms=as_float(raw.get("median_ms")), top_cpu=_ops(raw.get("top_cpu")),
        top_device=_ops(raw.get("top_device")), frames=_ops(raw.get("frames")), syncs=_ops(raw.get("syncs")),
        collectives=_ops(raw.get("collectives")), trace_file=as_str(raw.get("trace_file"), 200) or "",
        trace_bytes=as_int(raw.get("trace_bytes")) or 0, export_s=as_float(raw.get("export_s")) or 0.0,
        activities=tuple(str(a)[:16] for a in (raw.get("activities") or [])[:4]) if isinstance(
            raw.get("activities"), list) else (),
        with_stack=raw.get("with_stack") is True, record_shapes=raw.get("record_shapes") is True,
        problem=_clean(as_str(raw.get("problem"), MAX_TEXT) or ""),
        limits={str(k)[:32]: v for k, v in ((k, as_float(v)) for k, v in list(limits.items())[:16])
                if v is not None},
        finished_unix=as_float(raw.get("finished_unix")) or 0.0,
        started_unix=as_float(raw.get("started_unix")) or 0.0,
        stopped_unix=as_float(raw.get("stopped_unix")) or 0.0,
        cost_s=as_float(raw.get("cost_s")) or 0.0, train_s=as_float(raw.get("train_s")) or 0.0,
        export_began_unix=as_float(raw.get("export_began_unix")) or 0.0,
        export_deferred=raw.get("export_deferred") is True,
        export_after_training=raw.get("export_after_training") is True,
    )


def numbered_files(run_dir: Path, name: re.Pattern[str], limit: int) -> list[tuple[tuple[int, ...], Path]]:
    """The files of ``run_dir`` whose names match ``name``, by the numbers its groups capture (rank,
    then index or attempt), at most ``limit``; raises ``OSError`` when the folder cannot be listed."""
    found = [(tuple(int(g) for g in match.groups()), path) for path in run_dir.iterdir()
             if (match := name.match(path.name))]
    return sorted(found)[:limit]


def read_summaries(run_dir: Path, limit: int = 4096) -> tuple[list[CaptureSummary], list[str]]:
    """Every capture summary in ``run_dir`` (by rank, then index), and one line per unreadable one."""
    try:
        found = numbered_files(run_dir, _SUMMARY_NAME, limit)
    except OSError as error:
        return [], [f"captures: cannot list {run_dir} ({type(error).__name__})"]
    summaries, problems = [], []
    for _, path in found:
        try:
            summaries.append(decode_summary(read_json_object(path, MAX_SUMMARY_BYTES)))
        except RecordError as error:
            problems.append(f"captures: {path.name}: {error}"[:MAX_TEXT])
    return summaries, problems


MAX_STATUS_BYTES = 16 << 10
_STATUS_NAME = re.compile(r"^rank-(\d{1,7})\.capture-status\.json$")


def status_file_name(rank: int) -> str:
    """One rank's capture counts (``rank-R.capture-status.json``): taken, and refused by reason."""
    return f"rank-{rank}.capture-status.json"


@dataclass(frozen=True, slots=True)
class CaptureStatus:
    """One rank's capture counts, as its poller last wrote them."""

    rank: int
    started: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Requests not taken, by why: a limit (``interval``, ``rank cap``, ``run cap``), the cost ``budget``,
    a capture running, the user's profiler."""
    last_request: str = ""
    last_reason: str = ""
    last_refusal: str = ""
    budget: dict[str, float] = field(default_factory=dict)
    """The cost budget's numbers at the last automatic request: ``share``, ``waste_share``, ``train_s``,
    ``wasted_s``, ``spent_s``, ``expected_s`` (profiling), ``export_expected_s``, ``export_deferred``."""


def read_status(path: Path) -> CaptureStatus | None:
    """The status record at ``path`` (bounded), or ``None`` when there is none or it is unreadable."""
    try:
        raw = read_json_object(path, MAX_STATUS_BYTES)
    except RecordError:
        return None
    rank = as_int(raw.get("rank"))
    if rank is None:
        return None
    refused_raw = raw.get("refused")
    refused = {_clean(str(k))[:80]: n for k, n in ((k, as_int(v)) for k, v in (
        list(refused_raw.items())[:32] if isinstance(refused_raw, dict) else [])) if n is not None and n > 0}
    budget_raw = raw.get("budget")
    budget = {str(k)[:32]: v for k, v in ((k, as_float(v)) for k, v in (
        list(budget_raw.items())[:8] if isinstance(budget_raw, dict) else [])) if v is not None}
    return CaptureStatus(
        rank=rank, started=as_int(raw.get("started")) or 0, refused=refused,
        last_request=as_str(raw.get("last_request"), 64) or "",
        last_reason=as_str(raw.get("last_reason"), 32) or "",
        last_refusal=_clean(as_str(raw.get("last_refusal"), MAX_TEXT) or ""), budget=budget)


def read_statuses(run_dir: Path, limit: int = 4096) -> list[CaptureStatus]:
    """Every rank's status record in ``run_dir`` (by rank; unreadable ones left out)."""
    try:
        found = numbered_files(run_dir, _STATUS_NAME, limit)
    except OSError:
        return []
    return [s for s in (read_status(path) for _, path in found) if s is not None]
