"""The "Captures" section of the text, JSON and HTML reports (``docs/captures.md``)."""

from __future__ import annotations

from dataclasses import asdict
from html import escape

from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.sanitize import strip_control
from traceml_otel.wire.capture_record import CaptureSummary

MAX_SHOWN = 8


def _steps(capture: CaptureSummary) -> str:
    if not capture.steps:
        return "no step"
    ms = ", ".join(f"{v:.1f}" for v in capture.step_ms)
    base = f" (rank median {capture.median_ms:.1f} ms before)" if capture.median_ms else ""
    first, last = capture.steps[0], capture.steps[-1]
    return f"steps {first}-{last}: {ms} ms{base}"


def capture_lines(capture: CaptureSummary) -> list[str]:
    """One capture in a few lines: why, which steps, its files, what it names."""
    after = ", after the training" if capture.export_after_training else ""
    lines = [f"{capture.label()}  {capture.reason}: {capture.detail or '-'}",
             f"  {_steps(capture)}; trace {capture.trace_file or '(none)'}"
             + (f" ({capture.trace_bytes / 1024:.0f} KiB, written in {capture.export_s:.1f} s{after})"
                if capture.trace_file else "")]
    if capture.cost_s > 0:
        share = (f" ({capture.cost_s / capture.train_s:.1%} of the {capture.train_s:.1f} s of training "
                 "before it)" if capture.train_s > 0 else "")
        lines.append(f"  cost the training thread at most {capture.cost_s:.2f} s{share}")
    if capture.problem:
        lines.append(f"  note: {capture.problem}")
    tops = [("top CPU ops", capture.top_cpu[:5]), ("top device ops", capture.top_device[:5]),
            ("code", capture.frames[:3]), ("host syncs", capture.syncs[:3]),
            ("collectives", capture.collectives[:3])]
    for label, ops in tops:
        if ops:
            shown = "; ".join(f"{op.name} {op.share:.0%} x{op.count}" + (f" ({op.frame})" if op.frame else "")
                              for op in ops)
            lines.append(f"  {label}: {shown}")
    return [strip_control(line) for line in lines]


def captures_text(analysis: RunAnalysis) -> list[str]:
    """The text section (empty when the run folder holds no capture record)."""
    view = analysis.captures
    if view is None:
        return []
    lines = [f"Captures ({len(view.captures)}): torch.profiler traces of a few steps, open them in "
             "https://ui.perfetto.dev"]
    for capture in view.captures[:MAX_SHOWN]:
        lines += capture_lines(capture)
    if len(view.captures) > MAX_SHOWN:
        lines.append(f"  ... and {len(view.captures) - MAX_SHOWN} more in the run folder")
    for refusal in view.refusals[:3]:
        lines.append(f"rank {refusal.rank}: no capture taken: {strip_control(refusal.problem)}")
    if view.refused:
        shown = "; ".join(f"{why} x{count} on {ranks} rank{'s' if ranks > 1 else ''}"
                          for why, count, ranks in view.refused[:6])
        lines.append(strip_control(f"requests not taken: {shown}"))
    for marker in view.in_flight[:3]:
        state = "running" if marker.running else "armed"
        lines.append(strip_control(f"rank {marker.rank}: a capture ({marker.reason}) was {state} when the "
                                   "rank ended without a clean shutdown (no summary)"))
    if len(view.in_flight) > 3:
        lines.append(f"  ... and {len(view.in_flight) - 3} more ranks ended with a capture in flight")
    lines += [f"  {strip_control(problem)}" for problem in view.problems]
    return lines


def captures_json(analysis: RunAnalysis) -> dict[str, object]:
    """``captures``: every capture summary as recorded, and the refusals."""
    view = analysis.captures
    if view is None:
        return {"captures": [], "capture_refusals": [], "capture_problems": [], "capture_refused": [],
                "capture_in_flight": []}
    return {"captures": [asdict(c) for c in view.captures],
            "capture_refusals": [{"rank": r.rank, "reason": r.reason, "problem": r.problem}
                                 for r in view.refusals],
            "capture_problems": list(view.problems),
            "capture_refused": [{"why": why, "count": count, "ranks": ranks}
                                for why, count, ranks in view.refused],
            "capture_in_flight": [asdict(marker) for marker in view.in_flight]}


def captures_html(analysis: RunAnalysis) -> str:
    """The HTML card (empty without captures)."""
    lines = captures_text(analysis)
    if not lines:
        return ""
    body = "".join(f"<div>{escape(line)}</div>" for line in lines[1:])
    return f"<section><h2>{escape(lines[0].split(':', 1)[0])}</h2><pre>{body}</pre></section>"
