"""The end-of-run account of telemetry itself: what reached the local copy and OTLP, and what was lost.

Every number comes from the emitters' ``rank-R.export.json``, which they write after the fact:
``steps_local`` counts steps whose line reached the file, ``steps_traced`` is the trainer's own
count of steps it closed. The launcher first waits, within a bound, for every emitter's final
statistics (OTLP export may still be draining when the ranks have exited).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from traceml_otel.sanitize import one_line, strip_control
from traceml_otel.wire.export_stats import ExportStats, read_export_stats

FINAL_WAIT_EXTRA_S = 5.0
"""How much longer than ``TRACEML_SHUTDOWN_TIMEOUT_S`` the launcher waits for final statistics."""
MAX_RANKS_NAMED = 8
"""Ranks named on one aggregated line (the most affected first); the others are counted."""


def read_rank_exports(run_dir: Path) -> list[ExportStats]:
    """Every rank's export statistics in ``run_dir`` (unreadable files are skipped)."""
    return list(read_export_stats(run_dir).stats)


def wait_for_final_exports(run_dir: Path, timeout_s: float, poll_s: float = 0.1) -> list[ExportStats]:
    """Read the statistics once every emitter has written its final counts, or at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        exports = read_rank_exports(run_dir)
        if all(e.final or e.emitter_lost for e in exports) or time.monotonic() >= deadline:
            return exports
        time.sleep(poll_s)


def render_export_report(run_dir: Path, exports: list[ExportStats] | None = None) -> str:
    """A few lines: steps in the local copy against steps traced, OTLP delivery, every loss and fault."""
    if exports is None:
        exports = read_rank_exports(run_dir)
    if not exports:
        return strip_control(_no_statistics(run_dir))
    steps = sum(e.steps_received for e in exports)
    spans = sum(e.spans_local for e in exports)
    lines = [f"telemetry: {steps} steps, {spans} spans from {len(exports)} rank(s) in {one_line(run_dir)}"]
    lines.extend(_local_copy_lines(exports))
    endpoints = sorted({e.otlp_endpoint for e in exports if e.otlp_endpoint})
    if endpoints:
        exported = sum(e.otlp_exported for e in exports)
        dropped = sum(e.otlp_dropped for e in exports)
        budget = sum(e.otlp_budget_dropped for e in exports)
        sampler = sum(e.otlp_sampled_out for e in exports)
        lines.append(f"  OTLP to {', '.join(endpoints)}: {exported} spans delivered, {dropped} not delivered")
        probabilities = [e.otlp_sample_probability for e in exports if e.otlp_sample_probability is not None]
        if probabilities or budget or sampler:
            lowest = f"; lowest sample probability {min(probabilities):.3g}" if probabilities else ""
            kept, by_budget = exported + dropped, budget + sampler
            lines.append(f"    span budget: {kept} spans kept, {by_budget} dropped by the span budget "
                         f"(sampling by design, not loss; the local copy has every span), {dropped} lost"
                         f"{lowest}")
        reasons: dict[str, int] = {}
        for export in exports:
            for reason, count in export.otlp_drop_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
        for reason, count in sorted(reasons.items()):
            lines.append(f"    {count} spans: {reason}")
    else:
        lines.append("  OTLP: no endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT); local copy only")
    lines.extend(_metric_export_lines(exports))
    lines.extend(_rejected_value_lines(exports))
    for export in exports:
        prefix = f"  rank {export.rank}:"
        if export.emitter_lost:
            lines.append(f"{prefix} {export.emitter_lost}")
        elif not export.final:
            lines.append(f"{prefix} the emitter had not written its final counts when this account was made; "
                         "OTLP numbers may still change")
        for output, reason in export.outputs_disabled.items():
            lines.append(f"{prefix} {output} turned off: {reason}")
        for problem in export.problems:
            lines.append(f"{prefix} {problem}")
        if export.capture_dropped_steps:
            lines.append(f"{prefix} {export.capture_dropped_steps} steps lost before the emitter")
        if not export.clean_shutdown and not export.emitter_lost:
            lines.append(f"{prefix} {export.end_status}; steps after the last hand-off may be missing")
    return strip_control("\n".join(lines))  # problem texts quote paths and exception messages


def _no_statistics(run_dir: Path) -> str:
    """Why a run folder holds no export statistics, as far as the launcher can tell."""
    if run_dir.is_symlink():
        return (f"telemetry: {one_line(run_dir)} is a symbolic link (planted?); nothing was written or read "
                "through it (OTLP export went on: see the ranks' stderr)")
    folder = run_dir if run_dir.is_dir() else run_dir.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return (f"telemetry: no export statistics: {folder} is not writable (read-only runs folder?), so "
                "no local copy or statistics were written; OTLP export went on without them (the ranks' "
                "stderr says what each output did)")
    return f"telemetry: no export statistics in {one_line(run_dir)} (did the script call traceml.init()?)"


def _local_copy_lines(exports: list[ExportStats]) -> list[str]:
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


def _metric_export_lines(exports: list[ExportStats]) -> list[str]:
    """OTLP metric export calls that succeeded and failed (each failure loses one interval's points)."""
    sending = [e for e in exports if e.metrics_endpoint]
    if not sending:
        return []
    endpoints = sorted({e.metrics_endpoint for e in sending if e.metrics_endpoint})
    exported = sum(e.metric_exports for e in sending)
    failed = sum(e.metric_export_failures for e in sending)
    lines = [f"  OTLP metrics to {', '.join(endpoints)}: {exported} exports delivered, {failed} failed"]
    for export in sending:
        if export.metric_export_failures:
            cause = f" ({export.metric_last_error})" if export.metric_last_error else ""
            lines.append(f"    rank {export.rank}: {export.metric_export_failures} metric exports "
                         f"failed{cause}")
    return lines


def _rejected_value_lines(exports: list[ExportStats]) -> list[str]:
    """Measurements the duration histograms dropped as not finite or negative (OTLP's, else the scrape
    endpoint's): one line at any world size, naming at most ``MAX_RANKS_NAMED`` ranks, the most
    affected first."""
    rejecting = sorted((e for e in exports if e.metric_values_rejected),
                       key=lambda e: (-e.metric_values_rejected, e.rank))
    if not rejecting:
        return []
    total = sum(e.metric_values_rejected for e in rejecting)
    named = ", ".join(f"rank {e.rank}: {e.metric_values_rejected}" for e in rejecting[:MAX_RANKS_NAMED])
    more = len(rejecting) - MAX_RANKS_NAMED
    tail = f"; and {more} more ranks" if more > 0 else ""
    return [f"  metrics: {total} measurements not finite or negative (a clock fault?) left out of the "
            f"duration histograms ({named}{tail}); the spans and the other metrics keep those steps"]
