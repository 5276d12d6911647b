"""The end-of-run account of telemetry itself: what reached the local copy and OTLP, and what was lost.

Every number comes from the emitters' ``rank-R.export.json``, which they write after the fact:
``steps_local`` counts steps whose line reached the file, ``steps_traced`` is the trainer's own
count of steps it closed. The launcher first waits, within a bound, for every emitter's final
statistics (OTLP export may still be draining when the ranks have exited).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from traceml_otel.sanitize import strip_control

FINAL_WAIT_EXTRA_S = 5.0
"""How much longer than ``TRACEML_SHUTDOWN_TIMEOUT_S`` the launcher waits for final statistics."""


@dataclass(frozen=True, slots=True)
class RankExport:
    """One rank's ``rank-<R>.export.json``, as far as the report needs it."""

    rank: int
    steps: int
    spans_local: int
    capture_dropped_steps: int
    otlp_endpoint: str | None
    otlp_exported: int
    otlp_dropped: int
    otlp_drop_reasons: dict[str, int]
    clean_shutdown: bool
    end_status: str
    steps_local: int | None = None
    steps_traced: int | None = None
    local_copy_complete: bool | None = None
    outputs_disabled: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    final: bool = True


def _rank_export(raw: dict) -> RankExport:
    def optional_int(name: str) -> int | None:
        value = raw.get(name)
        return None if value is None else int(value)

    return RankExport(
        rank=int(raw["rank"]), steps=int(raw["steps_received"]),
        spans_local=int(raw["spans_local"]), capture_dropped_steps=int(raw["capture_dropped_steps"]),
        otlp_endpoint=raw.get("otlp_endpoint"),
        otlp_exported=int(raw["otlp_exported"]), otlp_dropped=int(raw["otlp_dropped"]),
        otlp_drop_reasons={str(k): int(v) for k, v in dict(raw.get("otlp_drop_reasons") or {}).items()},
        clean_shutdown=bool(raw["clean_shutdown"]), end_status=str(raw["end_status"]),
        steps_local=optional_int("steps_local"), steps_traced=optional_int("steps_traced"),
        local_copy_complete=raw.get("local_copy_complete"),
        outputs_disabled={str(k): str(v) for k, v in dict(raw.get("outputs_disabled") or {}).items()},
        problems=tuple(str(p) for p in raw.get("problems") or ()),
        final=bool(raw.get("final", True)),
    )


def read_rank_exports(run_dir: Path) -> list[RankExport]:
    """Every rank's export statistics in ``run_dir`` (unreadable files are skipped)."""
    exports = []
    for path in sorted(run_dir.glob("rank-*.export.json")):
        try:
            exports.append(_rank_export(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(exports, key=lambda e: e.rank)


def wait_for_final_exports(run_dir: Path, timeout_s: float, poll_s: float = 0.1) -> list[RankExport]:
    """Read the statistics once every emitter has written its final counts, or at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        exports = read_rank_exports(run_dir)
        if all(e.final for e in exports) or time.monotonic() >= deadline:
            return exports
        time.sleep(poll_s)


def render_export_report(run_dir: Path, exports: list[RankExport] | None = None) -> str:
    """A few lines: steps in the local copy against steps traced, OTLP delivery, every loss and fault."""
    if exports is None:
        exports = read_rank_exports(run_dir)
    if not exports:
        return f"telemetry: no export statistics in {run_dir} (did the script call traceml.init()?)"
    steps = sum(e.steps for e in exports)
    spans = sum(e.spans_local for e in exports)
    lines = [f"telemetry: {steps} steps, {spans} spans from {len(exports)} rank(s) in {run_dir}"]
    lines.extend(_local_copy_lines(exports))
    endpoints = sorted({e.otlp_endpoint for e in exports if e.otlp_endpoint})
    if endpoints:
        exported = sum(e.otlp_exported for e in exports)
        dropped = sum(e.otlp_dropped for e in exports)
        lines.append(f"  OTLP to {', '.join(endpoints)}: {exported} spans delivered, {dropped} not delivered")
        reasons: dict[str, int] = {}
        for export in exports:
            for reason, count in export.otlp_drop_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        for reason, count in sorted(reasons.items()):
            lines.append(f"    {count} spans: {reason}")
    else:
        lines.append("  OTLP: no endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT); local copy only")
    for export in exports:
        prefix = f"  rank {export.rank}:"
        if not export.final:
            lines.append(f"{prefix} the emitter had not written its final counts when this account was made; "
                         "OTLP numbers may still change")
        for output, reason in export.outputs_disabled.items():
            lines.append(f"{prefix} {output} turned off: {reason}")
        for problem in export.problems:
            lines.append(f"{prefix} {problem}")
        if export.capture_dropped_steps:
            lines.append(f"{prefix} {export.capture_dropped_steps} steps lost before the emitter")
        if not export.clean_shutdown:
            lines.append(f"{prefix} {export.end_status}; steps after the last hand-off may be missing")
    return strip_control("\n".join(lines))  # problem texts quote paths and exception messages


def _local_copy_lines(exports: list[RankExport]) -> list[str]:
    """The local copy's completeness, from what each emitter counted as written."""
    lines = []
    known = [e for e in exports if e.steps_traced is not None and e.steps_local is not None]
    if known and len(known) == len(exports) and all(e.local_copy_complete for e in known):
        written = sum(e.steps_local or 0 for e in known)
        lines.append(f"  local copy: {written} of {written} traced steps written (complete)")
        return lines
    for export in exports:
        if export.steps_local is None:
            continue
        if export.steps_traced is None:
            lines.append(f"  rank {export.rank}: local copy holds {export.steps_local} steps "
                         "(the trainer did not say how many it traced)")
        elif not export.local_copy_complete:
            lines.append(f"  rank {export.rank}: local copy holds {export.steps_local} of "
                         f"{export.steps_traced} traced steps (INCOMPLETE)")
    return lines
