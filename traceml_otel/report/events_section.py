"""The segments, stall events and straggler recurrence in the text, JSON and HTML reports."""

from __future__ import annotations

import textwrap
import time
from html import escape

from traceml_otel.analyze.findings import DriftAnalysis
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.segments import typical_seconds
from traceml_otel.report.units import seconds, signed_percent

MAX_ROWS = 12


def _clock(unix: float | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(unix)) if unix else "-"


def segment_rows(analysis: RunAnalysis) -> list[tuple[str, ...]]:
    """One row per segment: steps, time range, typical step, change, label, verdict (more than one only)."""
    found = analysis.segments
    if found is None or len(found.segments) < 2:
        return []
    rows = []
    for index, s in enumerate(found.segments):
        mark = "*" if index == found.reference else " "
        span = f"{_clock(s.start_unix)}-{_clock(s.end_unix)} UTC" if s.start_unix else "-"
        rows.append((mark, f"{s.first_step}-{s.last_step}", span, seconds(s.typical_s),
                     signed_percent(s.change, 0), s.label, s.verdict))
    return rows


def verdict_scope(analysis: RunAnalysis) -> str:
    """``steps 15-199, the steady segment with 61% of the training time at its typical step (see
    Segments)``, or empty."""
    found = analysis.segments
    if found is None or len(found.segments) < 2:
        return ""
    ref = found.segments[found.reference]
    typical = typical_seconds([s.steps for s in found.segments], [s.typical_s for s in found.segments])
    total = sum(typical)
    share = (f" with {typical[found.reference] / total:.0%} of the training time at its typical step"
             if total > 0 else "")
    return (f"the verdict of steps {ref.first_step}-{ref.last_step}, the {ref.label} segment{share} (see "
            "Segments); the table below averages the whole window")


def drift_segment(drift: DriftAnalysis) -> str:
    """``segment steps 200-299 (from 12:00:03 UTC) is +40% against steps 12-199``, or empty."""
    if drift.segment_steps is None or drift.reference_steps is None:
        return ""
    a, b = drift.segment_steps
    ra, rb = drift.reference_steps
    since = f" (from {_clock(drift.segment_start_unix)} UTC)" if drift.segment_start_unix else ""
    against_ref = f"{signed_percent(drift.segment_change, 0)} against the steady segment, steps {ra}-{rb}"
    typical, early = drift.segment_typical_s, drift.baseline_s
    if typical is not None and early and drift.segment_change is not None and (
            (typical > early) != (drift.segment_change > 0)):
        # The reference is a slow or fast patch (it holds most of the training time): the period's
        # change against the early steps is the drift's, the one against the reference points the other way.
        return (f"segment steps {a}-{b}{since} runs at {seconds(typical)} a step, "
                f"{signed_percent(typical / early - 1.0, 0)} against the early steps ({against_ref})")
    return f"segment steps {a}-{b}{since} changed by {against_ref}"


def events_text(analysis: RunAnalysis) -> list[str]:
    """The text section: segments (when more than one), then stall events and straggler recurrence."""
    lines: list[str] = []
    rows = segment_rows(analysis)
    if rows:
        lines.append("Segments (where the step time or phase mix changed; * holds most training time at its "
                     "typical step and gives the verdict)")
        for mark, steps, span, typical, change, label, verdict in rows[:MAX_ROWS]:
            lines.append(f"  {mark} steps {steps:<12} {span:<24} {typical:>9} {change:>6}  {label:<18} "
                         f"{verdict}")
    stalls = analysis.stalls
    if stalls.events:
        count = len(stalls.events) + stalls.left_out
        lines.append(f"Stalls     {count} event(s), left out of the per-step means")
        for e in stalls.events[:MAX_ROWS]:
            ranks = ",".join(str(r) for r in e.ranks[:8])
            where = f" at {e.location}" if e.location else ""
            lines.append(f"  {e.kind:<5} {_clock(e.start)} UTC  {e.seconds:8.1f} s  rank {ranks}{where}"
                         f"  step {e.step if e.step is not None else '-'}"
                         + ("" if e.resolved else "  (never resolved)"))
    rec = analysis.straggler_recurrence
    if rec is not None and rec.pattern != "none":
        wrapped = textwrap.wrap(f"{rec.text}. {rec.advice}", 89) or [""]
        lines += [f"Straggler  {wrapped[0]}", *(f"{'':11}{line}" for line in wrapped[1:])]
    return lines


def events_json(analysis: RunAnalysis) -> dict[str, object]:
    """The ``segments``, ``stalls`` and ``straggler_recurrence`` members of the JSON report."""
    found = analysis.segments
    rec = analysis.straggler_recurrence
    return {
        "segments": None if found is None else {
            "reference": found.reference,
            "method": found.method,
            "segments": [{
                "first_step": s.first_step, "last_step": s.last_step, "steps": s.steps,
                "start_time": s.start_unix, "end_time": s.end_unix, "typical_step_s": s.typical_s,
                "seconds": s.seconds, "input_share": s.input_share, "residual_share": s.residual_share,
                "label": s.label, "change": s.change, "verdict": s.verdict or None,
                "severity": s.severity or None, "title": s.title or None,
            } for s in found.segments],
        },
        "stalls": {
            "left_out": analysis.stalls.left_out,
            "events": [{
                "kind": e.kind, "start_time": e.start, "seconds": e.seconds, "step": e.step,
                "ranks": list(e.ranks), "waiting_ranks": list(e.waiting), "location": e.location or None,
                "resolved": e.resolved,
                "per_rank": [{"rank": p.rank, "step": p.step, "start_time": p.start, "seconds": p.seconds,
                              "waited": p.waited} for p in e.parts],
            } for e in analysis.stalls.events],
        },
        "straggler_recurrence": None if rec is None else {
            "pattern": rec.pattern, "window_steps": rec.window_steps, "windows": rec.windows,
            "culprits": list(rec.culprits), "window_first_steps": list(rec.window_starts),
            "counts": [{"rank": r, "windows": n} for r, n in rec.counts], "text": rec.text,
            "advice": rec.advice, "since_step": rec.since_step,
        },
    }


def events_html(analysis: RunAnalysis) -> str:
    """The HTML card (empty when there is one segment, no stall and no straggler pattern)."""
    lines = events_text(analysis)
    if not lines:
        return ""
    body = "".join(f"<div>{escape(line)}</div>" for line in lines)
    return f"<section><h2>Segments and events</h2><pre>{body}</pre></section>"
