"""The HTML form of a run comparison: one self-contained page, no scripts, every string escaped."""

from __future__ import annotations

from traceml_otel.analyze.compare_interval import Interval
from traceml_otel.analyze.compare_judged import interval_text
from traceml_otel.analyze.compare_policy import Change, Comparison
from traceml_otel.analyze.compare_summary import RunSummary
from traceml_otel.report.html import _CSS, _card, _e, _html_table
from traceml_otel.report.units import PHASE_LABELS, kind_label, seconds, size

_BADGE = {"REGRESSION": "critical", "IMPROVEMENT": "info", "EQUIVALENT": "info", "INCONCLUSIVE": "warning"}


def _pct(change: float | None) -> str:
    return "n/a" if change is None else f"{change * 100:+.1f} %"


def _side_row(name: str, s: RunSummary) -> str:
    if s.problem:
        cells = [name, s.label, f"no usable data: {s.problem}", "", "", ""]
    else:
        runs = ", ".join(r.label for r in s.members) if s.members else s.label
        work = "" if s.time_per_sample is None else seconds(s.time_per_sample)
        cells = [name, runs, f"{kind_label(s.kind)} [{s.severity}]", str(s.steps), seconds(s.step_time), work]
    return "<tr>" + "".join(f'<td class="{"left" if i < 3 else ""}">{_e(c)}</td>'
                            for i, c in enumerate(cells)) + "</tr>"


def _change_row(label: str, change: Change, fmt) -> str:
    cells = [label, fmt(change.before), fmt(change.after), _pct(change.change),
             change.verdict + (" (material)" if change.material else "")]
    return "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"


def _interval_row(label: str, interval: Interval) -> str:
    cells = [label, interval_text(interval), f"{interval.low * 100:+.1f} % .. {interval.high * 100:+.1f} %",
             interval.verdict, interval.method]
    return "<tr>" + "".join(f'<td class="{"left" if i in (0, 4) else ""}">{_e(c)}</td>'
                            for i, c in enumerate(cells)) + "</tr>"


def render_comparison_html(comparison: Comparison) -> str:
    """The comparison as a self-contained HTML page."""
    c = comparison
    badge = _BADGE.get(c.verdict, "warning")
    headline = c.verdict + (" (material)" if c.material else "")
    verdict = (f'<section class="card verdict {badge}"><div class="kind">{_e(headline)}'
               f'<span class="badge {badge}">{_e(c.basis)}</span></div>')
    if c.interval is not None:
        verdict += f"<p>Change per {_e(c.basis)}: <b>{_e(interval_text(c.interval))}</b> (95 % interval)</p>"
    verdict += "</section>"
    sides = _card("Runs", _html_table(["side", "runs", "diagnosis", "steps", "step time", "per sample"],
                                      [_side_row("A", c.a), _side_row("B", c.b)], left=(0, 1, 2)))
    body = verdict + sides
    rows = []
    if c.interval is not None:
        kind = "on-CPU time" if c.interval.name.startswith("on_cpu") else "wall time"
        rows.append(_interval_row(f"deciding: {kind}", c.interval))
    if c.wall is not None and c.wall is not c.interval:
        rows.append(_interval_row("wall time", c.wall))
    if c.cpu is not None and c.cpu is not c.interval:
        rows.append(_interval_row("on-CPU time", c.cpu))
    if rows:
        body += _card("Interval and method", _html_table(["", "change", "95 % interval", "verdict", "method"],
                                                         rows, left=(0, 4)))
    changes = []
    if c.work is not None:
        changes.append(_change_row(f"per {c.basis}", c.work, seconds))
    changes += [_change_row("step time", c.step_time, seconds),
                _change_row("peak memory", c.memory, lambda v: size(v) if v is not None else "n/a")]
    changes += [_change_row(PHASE_LABELS.get(p.name, p.name), p, seconds) for p in c.phases]
    body += _card("Changes", _html_table(["", "A", "B", "change", "verdict"], changes)
                  + f'<p class="muted">diagnosis {_e(kind_label(c.a.kind))} -&gt; '
                  f"{_e(kind_label(c.b.kind))}: {_e(c.diagnosis)}</p>")
    if c.notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in c.notes)
        body += _card("Notes", f'<ul class="issues">{items}</ul>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e('traceml-otel compare: ' + headline)}</title><style>{_CSS}</style></head><body><main>"
        f"<header><h1>Compare</h1></header>{body}"
        "<footer>traceml-otel compare - self-contained page, no scripts</footer></main></body></html>\n"
    )
