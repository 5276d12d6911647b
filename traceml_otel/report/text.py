"""The text report: a Verdict / Why / Next card, the phase table, then drift, slow steps and memory."""

from __future__ import annotations

import textwrap

from traceml_otel.analyze.findings import MemoryAnalysis
from traceml_otel.analyze.kinds import MemoryKind
from traceml_otel.analyze.rules import missing_signals
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.report.captures_section import captures_text
from traceml_otel.report.events_section import drift_segment, events_text, verdict_scope
from traceml_otel.report.time_section import time_text
from traceml_otel.report.units import (
    PHASE_LABELS,
    communication_sentence,
    drift_sentence,
    kind_label,
    percent,
    seconds,
    size,
    startup_text,
    step_sources_text,
    table_rows,
    throughput_gap,
    throughput_sentence,
    trace_link,
    updates_sentence,
)
from traceml_otel.sanitize import one_line

WIDTH = 100
_LABEL = 10


def _field(label: str, text: str) -> list[str]:
    """``label`` in a fixed column, ``text`` wrapped beside it."""
    lines = textwrap.wrap(text, WIDTH - _LABEL - 1) or [""]
    return [f"{label:<{_LABEL}} {lines[0]}"] + [" " * (_LABEL + 1) + line for line in lines[1:]]


def _header(analysis: RunAnalysis) -> list[str]:
    run, window = analysis.run, analysis.window
    ranks = len(analysis.ranks) or len(run.ranks)
    parts = [f"{ranks} rank{'s' if ranks != 1 else ''}"]
    if run.parallelism != "none":
        parts[0] += f" ({run.parallelism})"
    if window.steps:
        span = f"steps {window.first_step}-{window.last_step}" if window.first_step is not None else ""
        detail = ", ".join(part for part in (span, window.requested) if part)
        parts.append(f"{window.steps} aligned steps" + (f" ({detail})" if detail else ""))
    else:
        parts.append("no aligned steps")
    parts.append(f"{analysis.clock} clock")
    lines = [
        f"traceml-otel diagnosis  run {run.run_id or '(unknown)'}",
        f"source: {one_line(run.source)}",
        " | ".join(parts),
    ]
    if run.step_sources:
        lines.append(f"steps found by: {step_sources_text(run.step_sources)}")
    if startup := startup_text(window):
        lines += textwrap.wrap(f"start-up: {startup}", WIDTH, subsequent_indent="  ")
    return lines


def _run_findings(analysis: RunAnalysis) -> list[str]:
    lines: list[str] = []
    for finding in analysis.run_findings:
        lines += _field("Caution", f"{kind_label(finding.kind)} [{finding.severity}] - {finding.title}. "
                                   f"{finding.why}")
    return lines


def _card(analysis: RunAnalysis) -> list[str]:
    primary = analysis.step.primary
    lines = _run_findings(analysis)
    lines += _field("Verdict", f"{kind_label(primary.kind)} [{primary.severity}] - {primary.title}")
    scope = verdict_scope(analysis)
    if scope:
        lines += _field("Scope", scope)
    lines += _field("Why", primary.why)
    lines += _field("Next", primary.next)
    for other in analysis.step.issues[1:]:
        lines += _field("Also", f"{kind_label(other.kind)} [{other.severity}] - {other.why}")
    if analysis.step.caps and analysis.step.issues:
        lines += _field("Note", f"severity capped at warning: {', '.join(analysis.step.caps)}")
    if analysis.step.abstentions and primary.kind != "INCOMPLETE_DATA":
        lines += _field("Missing", "; ".join(missing_signals(analysis.step.abstentions)))
    return lines


def _table(analysis: RunAnalysis) -> list[str]:
    multi = len(analysis.ranks) > 1
    head = f"{'phase':<12} {'average':>10} {'share':>7}"
    if multi:
        head += f" {'worst':>10} {'skew':>7} {'worst rank':>10}"
    lines = [f"Where the step time goes ({'median over ranks, ' if multi else ''}mean per step)", head]
    for name in table_rows(analysis.ranks):
        summary = analysis.summary(name)
        if summary is None:
            continue
        share = "100%" if name == "step_time" and summary.median is not None else percent(summary.share, 1)
        row = f"{PHASE_LABELS[name]:<12} {seconds(summary.median):>10} {share:>7}"
        if multi:
            rank = "" if summary.worst_rank is None else str(summary.worst_rank)
            row += f" {seconds(summary.worst):>10} {percent(summary.skew):>7} {rank:>10}"
        lines.append(row)
    note = communication_sentence(analysis)
    return lines + (textwrap.wrap(note, WIDTH) if note else [])


def _throughput(analysis: RunAnalysis) -> list[str]:
    text = throughput_sentence(analysis.throughput)
    if not text:
        text = f"not known: {throughput_gap(analysis)}"
    return _field("Throughput", text)


def _updates(analysis: RunAnalysis) -> list[str]:
    text = updates_sentence(analysis.accumulation)
    return _field("Updates", text) if text else []


def _drift(analysis: RunAnalysis) -> list[str]:
    segment = drift_segment(analysis.drift)
    return _field("Drift", drift_sentence(analysis.drift) + (f"; {segment}" if segment else ""))


def _worst(analysis: RunAnalysis, trace_url: str | None = None) -> list[str]:
    if not analysis.worst_steps:
        return []
    lines = ["Slowest steps"]
    for worst in analysis.worst_steps:
        part = f"{PHASE_LABELS.get(worst.dominant, worst.dominant)} {seconds(worst.dominant_s)}"
        lines.append(
            f"  step {worst.step:<7} rank {worst.rank:<3} {seconds(worst.step_time):>10}  mostly {part:<24} "
            f"trace {trace_link(trace_url, worst.trace_id) or worst.trace_id or '-'}"
        )
    return lines


def _memory(memory: MemoryAnalysis) -> list[str]:
    if memory.status is MemoryKind.NO_GPU:
        return _field("Memory", "NO GPU - no CUDA memory peaks were recorded (CPU run)")
    peaks = ", ".join(
        f"rank {m.rank} {size(m.peak_reserved)}" for m in memory.ranks if m.peak_reserved is not None
    )
    if memory.status is MemoryKind.NOT_ENOUGH_STEPS:
        return _field("Memory", f"peak reserved {peaks}; fewer than 50 steps, no memory diagnosis")
    lines = _field("Memory", f"{kind_label(memory.status)} - peak reserved {peaks}")
    for finding in memory.findings:
        lines += _field("", f"{kind_label(finding.kind)} [{finding.severity}] {finding.why} {finding.next}")
    return lines


def _warnings(analysis: RunAnalysis) -> list[str]:
    run = analysis.run
    if not run.warnings_total:
        return []
    shown = list(run.warnings[:5])
    more = run.warnings_total - len(shown)
    text = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    return _field("Warnings", text)


def render_text(analysis: RunAnalysis, *, trace_url: str | None = None) -> str:
    """The whole text report; with ``trace_url`` the slowest steps show trace URLs, not bare ids."""
    sections: list[list[str]] = [_header(analysis), _card(analysis)]
    if analysis.ranks:
        sections.append(_table(analysis) + _throughput(analysis))
    tail = _updates(analysis) + _drift(analysis) + _memory(analysis.memory) + _warnings(analysis)
    sections += [events_text(analysis), _worst(analysis, trace_url), time_text(analysis), tail,
                 captures_text(analysis)]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"


class TextReporter:
    """Renders a run analysis as the plain-text report."""

    def __init__(self, trace_url: str | None = None) -> None:
        self.trace_url = trace_url

    def render(self, analysis: RunAnalysis) -> str:
        return render_text(analysis, trace_url=self.trace_url)
