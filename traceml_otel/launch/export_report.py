"""The end-of-run account of telemetry itself: what reached the local copy and OTLP, and what was lost."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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


def read_rank_exports(run_dir: Path) -> list[RankExport]:
    """Every rank's export statistics in ``run_dir`` (unreadable files are skipped)."""
    exports = []
    for path in sorted(run_dir.glob("rank-*.export.json")):
        try:
            raw = json.loads(path.read_text())
            exports.append(RankExport(
                rank=int(raw["rank"]), steps=int(raw["steps_received"]),
                spans_local=int(raw["spans_local"]), capture_dropped_steps=int(raw["capture_dropped_steps"]),
                otlp_endpoint=raw.get("otlp_endpoint"),
                otlp_exported=int(raw["otlp_exported"]), otlp_dropped=int(raw["otlp_dropped"]),
                otlp_drop_reasons=dict(raw.get("otlp_drop_reasons") or {}),
                clean_shutdown=bool(raw["clean_shutdown"]), end_status=str(raw["end_status"]),
            ))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(exports, key=lambda e: e.rank)


def render_export_report(run_dir: Path) -> str:
    """A few lines: spans kept locally, OTLP delivery, and every loss with its reason."""
    exports = read_rank_exports(run_dir)
    if not exports:
        return f"telemetry: no export statistics in {run_dir} (did the script call traceml.init()?)"
    steps = sum(e.steps for e in exports)
    spans = sum(e.spans_local for e in exports)
    lines = [f"telemetry: {steps} steps, {spans} spans from {len(exports)} rank(s) in {run_dir}"]
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
        if export.capture_dropped_steps:
            lines.append(f"{prefix} {export.capture_dropped_steps} steps lost before the emitter")
        if not export.clean_shutdown:
            lines.append(f"{prefix} {export.end_status}; steps after the last hand-off may be missing")
    return "\n".join(lines)
