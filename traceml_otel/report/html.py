"""The HTML report: one self-contained page (inline CSS and SVG, no scripts, no network).

Every string that comes from the data (run ids, commands, warnings, file names) is escaped.
"""

from __future__ import annotations

from html import escape

from traceml_otel.analyze.findings import Finding
from traceml_otel.analyze.kinds import DriftKind, MemoryKind
from traceml_otel.analyze.rules import missing_signals
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.report.captures_section import captures_html
from traceml_otel.report.events_section import events_html
from traceml_otel.report.palette import PHASE_COLORS, RANK_COLORS
from traceml_otel.report.svg import BarRow, Line, line_chart, stacked_bars
from traceml_otel.report.time_section import time_html
from traceml_otel.report.units import (
    PHASE_LABELS,
    communication_sentence,
    drift_sentence,
    gib,
    kind_label,
    percent,
    plural,
    seconds,
    signed_percent,
    size,
    startup_text,
    table_rows,
    throughput_sentence,
    trace_link,
    updates_sentence,
)

GIB = float(1 << 30)

SEGMENTS = tuple(PHASE_COLORS.items())
_CSS = """
body{margin:0;background:#f3f4f6;color:#111827;font:14px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif}
main{max-width:1080px;margin:0 auto;padding:24px 20px 40px}
h1{font-size:22px;margin:0 0 2px} h2{font-size:16px;margin:0 0 12px}
.muted{color:#6b7280} .mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:18px 20px;margin:16px 0}
.chips span{display:inline-block;background:#eef2ff;color:#3730a3;border-radius:999px;padding:2px 10px;
 margin:6px 6px 0 0;font-size:12.5px}
.verdict{border-left:6px solid #2563eb} .verdict.warning{border-left-color:#d97706}
.verdict.critical{border-left-color:#dc2626} .verdict.info{border-left-color:#059669}
.kind{font-size:20px;font-weight:700;letter-spacing:.02em}
.badge{display:inline-block;border-radius:6px;padding:1px 8px;font-size:12px;font-weight:600;margin-left:8px;
 vertical-align:middle;text-transform:uppercase;background:#e5e7eb;color:#374151}
.badge.critical{background:#fee2e2;color:#991b1b} .badge.warning{background:#fef3c7;color:#92400e}
.badge.info{background:#d1fae5;color:#065f46}
dl.wn{display:grid;grid-template-columns:64px 1fr;gap:6px 12px;margin:12px 0 0}
dl.wn dt{font-weight:600;color:#374151}
dl.wn dd{margin:0}
table{border-collapse:collapse;width:100%}
th,td{padding:6px 10px;text-align:right;border-bottom:1px solid #f0f1f3}
th{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:#6b7280;font-weight:600}
th:first-child,td:first-child,th.left,td.left{text-align:left}
tr.total td{font-weight:600;border-top:2px solid #e5e7eb}
.chart+.chart{margin-top:22px} .mono.left{color:#374151}
ul.issues{margin:10px 0 0;padding-left:18px} ul.issues li{margin:4px 0}
.caution{background:#fff7ed;border:1px solid #fed7aa;border-radius:8px;padding:8px 12px;margin:0 0 12px}
.note{background:#f9fafb;border:1px dashed #d1d5db;border-radius:8px;padding:14px;color:#4b5563}
svg{width:100%;height:auto;display:block}
footer{color:#9ca3af;font-size:12px;text-align:center;margin-top:24px}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _header(analysis: RunAnalysis) -> str:
    run, window = analysis.run, analysis.window
    chips = [plural(len(analysis.ranks) or len(run.ranks), "rank")]
    if run.parallelism != "none":
        chips.append(run.parallelism.upper())
    if window.steps:
        chips.append(f"{window.steps} aligned steps ({window.first_step}-{window.last_step})")
    if window.requested:
        chips.append(f"window: {window.requested}")
    chips.append(f"{analysis.clock} clock")
    chips.append(f"{run.spans_read:,} spans")
    command = f'<div class="mono muted">{_e(run.command)}</div>' if run.command else ""
    if startup := startup_text(window):
        command += f'<div class="muted">start-up: {_e(startup)}</div>'
    return (
        f"<header><h1>Run {_e(run.run_id or '(unknown)')}</h1>"
        f'<div class="muted">source: <span class="mono">{_e(run.source)}</span></div>{command}'
        f'<div class="chips">{"".join(f"<span>{_e(c)}</span>" for c in chips)}</div></header>'
    )


def _verdict(analysis: RunAnalysis) -> str:
    primary = analysis.step.primary
    severity = _e(primary.severity)
    others = "".join(
        f'<li><b>{_e(kind_label(f.kind))}</b><span class="badge {_e(f.severity)}">{_e(f.severity)}</span> '
        f"{_e(f.why)}</li>"
        for f in analysis.step.issues[1:]
    )
    extra = f'<ul class="issues">{others}</ul>' if others else ""
    notes = []
    if analysis.step.caps and analysis.step.issues:
        notes.append(f"Severity capped at warning: {', '.join(analysis.step.caps)}.")
    if analysis.step.abstentions and primary.kind != "INCOMPLETE_DATA":
        notes.append(f"Not measured on every step: {'; '.join(missing_signals(analysis.step.abstentions))}.")
    note = "".join(f'<p class="muted">{_e(n)}</p>' for n in notes)
    cautions = "".join(
        f'<p class="caution"><b>{_e(kind_label(f.kind))}</b><span class="badge {_e(f.severity)}">'
        f"{_e(f.severity)}</span> {_e(f.title)}. {_e(f.why)}</p>"
        for f in analysis.run_findings
    )
    return (
        f'<section class="card verdict {severity}">{cautions}'
        f'<div><span class="kind">{_e(kind_label(primary.kind))}</span>'
        f'<span class="badge {severity}">{severity}</span></div><div class="muted">{_e(primary.title)}</div>'
        f'<dl class="wn"><dt>Why</dt><dd>{_e(primary.why)}</dd><dt>Next</dt><dd>{_e(primary.next)}</dd></dl>'
        f"{extra}{note}</section>"
    )


def _table(analysis: RunAnalysis) -> str:
    multi = len(analysis.ranks) > 1
    names = ["phase", "average", "share"] + (["worst", "skew", "worst rank"] if multi else [])
    rows = []
    for name in table_rows(analysis.ranks):
        s = analysis.summary(name)
        if s is None:
            continue
        share = "100%" if name == "step_time" and s.median is not None else percent(s.share, 1)
        cells = [PHASE_LABELS[name], seconds(s.median), share]
        if multi:
            cells += [seconds(s.worst), percent(s.skew), "" if s.worst_rank is None else str(s.worst_rank)]
        css = ' class="total"' if name == "step_time" else ""
        rows.append(f"<tr{css}>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    caption = "median over ranks of each rank's mean per step" if multi else "mean per step"
    work = throughput_sentence(analysis.throughput)
    work_line = f"<p><b>Throughput</b>: {_e(work)}</p>" if work else ""
    notes = [
        text for text in (communication_sentence(analysis), updates_sentence(analysis.accumulation)) if text
    ]
    return (
        f'<section class="card"><h2>Where the step time goes <span class="muted">({_e(caption)})</span></h2>'
        f"{_html_table(names, rows)}{work_line}{''.join(_paragraph(text) for text in notes)}</section>"
    )


def _html_table(names: list[str], rows: list[str], left: tuple[int, ...] = ()) -> str:
    css = ' class="left"'
    head = "".join(f"<th{css if i in left else ''}>{_e(n)}</th>" for i, n in enumerate(names))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _paragraph(text: str) -> str:
    return f'<p class="muted">{_e(text)}</p>'


def _charts(analysis: RunAnalysis) -> str:
    drift = analysis.drift
    marker = None
    if drift.since_step is not None and drift.kind is not DriftKind.STABLE:
        marker = (float(drift.since_step), f"{signed_percent(drift.change, 0)} from step {drift.since_step}")
    lines = [
        Line(f"rank {s.rank}", RANK_COLORS[i % len(RANK_COLORS)], s.steps, s.step_time)
        for i, s in enumerate(analysis.series)
        if s.steps
    ]
    timeline = line_chart(lines, y_format=seconds, x_label="step", title="Step time per rank", marker=marker)
    shown = [(name, color) for name, color in SEGMENTS if name in table_rows(analysis.ranks)]
    bars = stacked_bars(
        [BarRow(f"rank {m.rank}", [getattr(m, name) for name, _ in shown]) for m in analysis.ranks],
        [(PHASE_LABELS[name], color) for name, color in shown],
        value_format=seconds,
        title="Phase breakdown per rank (mean per step)",
    )
    body = "".join(f'<div class="chart">{svg}</div>' for svg in (timeline, bars) if svg)
    return (
        f'<section class="card"><h2>Step time</h2>{body or _note("No step data to chart.")}'
        f"{_paragraph('Drift: ' + drift_sentence(drift) + '.')}</section>"
    )


def _trace_cell(trace_id: str, trace_url: str | None) -> str:
    link = trace_link(trace_url, trace_id)
    if link is None:
        return _e(trace_id or "-")
    return f'<a href="{_e(link)}" rel="noopener noreferrer">{_e(trace_id)}</a>'


def _worst(analysis: RunAnalysis, trace_url: str | None = None) -> str:
    if not analysis.worst_steps:
        return ""
    rows = [
        f"<tr><td>{w.step}</td><td>{w.rank}</td><td>{_e(seconds(w.step_time))}</td>"
        f'<td class="left">{_e(PHASE_LABELS.get(w.dominant, w.dominant))} {_e(seconds(w.dominant_s))}</td>'
        f'<td class="left mono">{_trace_cell(w.trace_id, trace_url)}</td></tr>'
        for w in analysis.worst_steps
    ]
    names = ["step", "rank", "step time", "mostly", "trace id"]
    return f'<section class="card"><h2>Slowest steps</h2>{_html_table(names, rows, left=(3, 4))}</section>'


def _memory(analysis: RunAnalysis) -> str:
    memory = analysis.memory
    if memory.status is MemoryKind.NO_GPU:
        return _card("Memory", _note("NO GPU: no CUDA memory peaks were recorded (CPU run)."))
    lines = [
        Line(
            f"rank {s.rank}",
            RANK_COLORS[i % len(RANK_COLORS)],
            [x for x, p in zip(s.steps, s.peak_reserved, strict=True) if p is not None],
            [p / GIB for p in s.peak_reserved if p is not None],
        )
        for i, s in enumerate(analysis.series)
    ]
    chart = line_chart(
        [ln for ln in lines if ln.xs], y_format=gib, x_label="step", title="Peak reserved memory per rank"
    )
    if memory.findings:
        status = f'<ul class="issues">{"".join(_finding_item(f) for f in memory.findings)}</ul>'
    elif memory.status is MemoryKind.NOT_ENOUGH_STEPS:
        status = _paragraph("Fewer than 50 steps: peaks shown, no memory diagnosis.")
    else:
        status = f"<p><b>{_e(kind_label(memory.status))}</b>: no memory pressure, imbalance or creep.</p>"
    peaks = ", ".join(
        f"rank {m.rank} {size(m.peak_reserved)}" for m in memory.ranks if m.peak_reserved is not None
    )
    return _card(
        "Memory", status + _paragraph(f"Peak reserved: {peaks}.") + f'<div class="chart">{chart}</div>'
    )


def _card(title: str, body: str) -> str:
    return f'<section class="card"><h2>{_e(title)}</h2>{body}</section>'


def _finding_item(finding: Finding) -> str:
    return (
        f'<li><b>{_e(kind_label(finding.kind))}</b><span class="badge {_e(finding.severity)}">'
        f"{_e(finding.severity)}</span> {_e(finding.why)} {_e(finding.next)}</li>"
    )


def _warnings(analysis: RunAnalysis) -> str:
    run = analysis.run
    if not run.warnings_total:
        return ""
    items = "".join(f'<li class="mono">{_e(w)}</li>' for w in run.warnings)
    more = run.warnings_total - len(run.warnings)
    tail = _paragraph(f"and {more} more") if more > 0 else ""
    return _card(f"Input warnings ({run.warnings_total})", f'<ul class="issues">{items}</ul>{tail}')


def _note(text: str) -> str:
    return f'<div class="note">{_e(text)}</div>'


def render_html(analysis: RunAnalysis, *, trace_url: str | None = None) -> str:
    """The whole page; with ``trace_url`` (a template with ``{trace_id}``) trace ids are links."""
    body = (
        "".join(part(analysis) for part in (_header, _verdict, _table, _charts))
        + _worst(analysis, trace_url)
        + "".join(part(analysis) for part in (events_html, _memory, time_html, _warnings, captures_html))
        if analysis.ranks
        else _header(analysis) + _verdict(analysis) + time_html(analysis) + _warnings(analysis)
    )
    title = f"traceml-otel: {analysis.run.run_id} - {kind_label(analysis.step.primary.kind)}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{body}"
        "<footer>traceml-otel report - self-contained page, no scripts</footer></main></body></html>\n"
    )


class HtmlReporter:
    """Renders a run analysis as a self-contained HTML page."""

    def __init__(self, trace_url: str | None = None) -> None:
        self.trace_url = trace_url

    def render(self, analysis: RunAnalysis) -> str:
        return render_html(analysis, trace_url=self.trace_url)
