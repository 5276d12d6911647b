"""The "where the job's time went" section and the MFU line, in text, JSON and HTML (docs/goodput.md)."""

from __future__ import annotations

from html import escape

from traceml_otel.analyze.mfu import MfuAnalysis
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.analyze.time_accounting import PRODUCTIVE, TimeAccount
from traceml_otel.report.palette import category_colors
from traceml_otel.report.svg import BarRow, stacked_bars
from traceml_otel.sanitize import strip_control

MAX_RANK_BARS = 16
"""Ranks drawn in the chart: the job, then the lowest-goodput ranks."""

_LABELS = {
    "restarts": "restarts (failure to restart)", "redone_steps": "steps redone after a restart",
    "startup": "start-up",
    "between_steps": "between steps (unnamed)", "stalled": "stalled", "shutdown": "shutdown",
    "step.input_wait": "step: input wait", "step.residual": "step: other (residual)",
    "telemetry": "telemetry (final export, linger)",
}


def category_label(name: str) -> str:
    """A category's label for people: ``outside.evaluation`` -> ``evaluation``."""
    if name in _LABELS:
        return _LABELS[name]
    if name.startswith("step."):
        return "step: " + name.removeprefix("step.")
    return strip_control(name.removeprefix("outside."))[:40]


def _percent(part: float, whole: float) -> str:
    return f"{part / whole * 100:.1f} %" if whole > 0 else "-"


def mfu_sentence(mfu: MfuAnalysis) -> str:
    """``MFU 41.2 % (job: achieved / peak FLOP/s over 4 ranks; FLOPs declared)``, or why it is not shown."""
    if mfu.mfu is None:
        return "MFU not shown: " + "; ".join(strip_control(p) for p in mfu.problems[:3])
    valid = [r for r in mfu.ranks if r.mfu is not None]
    sources = sorted({r.source for r in valid})
    text = (f"MFU {mfu.mfu * 100:.1f} % (achieved model FLOP/s over peak, {len(valid)} rank(s); "
            f"FLOPs {', '.join(sources)})")
    if mfu.problems:
        text += f"; {len(mfu.problems)} rank(s) not counted: " + strip_control(mfu.problems[0])
    return text


def time_text(analysis: RunAnalysis) -> list[str]:
    """The text section (empty without time records)."""
    account = analysis.time_account
    lines: list[str] = []
    if account is not None:
        goodput = "-" if account.goodput is None else f"{account.goodput * 100:.1f} %"
        lines += [f"Where the job's time went (all ranks, {account.wall_s:.1f} rank-seconds; "
                  f"goodput {goodput})"]
        shown = [(name, category_label(name), seconds) for name, seconds in account.categories
                 if seconds >= 0.0005 or name in ("startup", "shutdown")]
        width = max([28, *(len(label) for _, label, _ in shown)])  # one column for all
        for name, label, seconds in shown:
            mark = "*" if name in PRODUCTIVE else " "
            share = _percent(seconds, account.wall_s)
            lines.append(f"  {mark} {label:{width}s} {seconds:10.2f} s  {share:>8s}")
        lines.append("  (* productive: goodput's numerator)")
        lines += [f"  {strip_control(f.text)}: {strip_control(f.advice)}" for f in account.findings]
        lines += [f"  note: {strip_control(note)}" for note in account.notes[:5]]
    if analysis.mfu is not None:
        lines.append(mfu_sentence(analysis.mfu))
    return lines


def time_json(account: TimeAccount | None, mfu: MfuAnalysis | None) -> dict[str, object]:
    """The ``time_accounting`` and ``mfu`` members of the JSON report (``None`` when not recorded)."""
    return {
        "time_accounting": None if account is None else {
            "wall_s": account.wall_s,
            "goodput": account.goodput,
            "productive": sorted(PRODUCTIVE),
            "categories": [{"name": name, "seconds": seconds} for name, seconds in account.categories],
            "findings": [{"category": f.category, "share": f.share, "seconds": f.seconds, "text": f.text,
                          "advice": f.advice} for f in account.findings],
            "notes": list(account.notes),
            "ranks": [{"rank": r.rank, "wall_s": r.wall_s, "goodput": r.goodput,
                       "categories": [{"name": n, "seconds": s} for n, s in r.categories]}
                      for r in account.ranks],
        },
        "mfu": None if mfu is None else {
            "mfu": mfu.mfu,
            "problems": list(mfu.problems),
            "ranks": [{"rank": r.rank, "mfu": r.mfu, "flops_per_s": r.flops_per_s, "peak_flops": r.peak_flops,
                       "source": r.source, "problem": r.problem} for r in mfu.ranks],
        },
    }


def time_html(analysis: RunAnalysis) -> str:
    """The HTML card: a stacked bar per rank (job first) and the table; empty without records."""
    account = analysis.time_account
    parts: list[str] = []
    if account is not None:
        names = [name for name, _ in account.categories]
        segments = list(zip([category_label(n) for n in names], category_colors(names), strict=True))
        ranks = sorted(account.ranks, key=lambda r: r.goodput if r.goodput is not None else 0.0)
        ranks = ranks[:MAX_RANK_BARS]
        rows = [BarRow("job (mean)", [dict(account.categories).get(n, 0.0) / max(1, len(account.ranks))
                                      for n in names])]
        rows += [BarRow(f"rank {r.rank}", [r.seconds(n) for n in names]) for r in ranks]
        parts.append(stacked_bars(rows, segments, value_format=lambda v: f"{v:.1f} s",
                                  title="Wall time by category (seconds)"))
        body = "".join(
            f"<tr><td>{escape(category_label(n))}{' *' if n in PRODUCTIVE else ''}</td>"
            f"<td>{s:.2f} s</td><td>{escape(_percent(s, account.wall_s))}</td></tr>"
            for n, s in account.categories
        )
        goodput = "-" if account.goodput is None else f"{account.goodput * 100:.1f} %"
        parts.append(f"<p>Goodput {escape(goodput)} of {account.wall_s:.1f} rank-seconds "
                     "(* productive).</p><table><tr><th>category</th><th>time</th><th>share</th></tr>"
                     f"{body}</table>")
        parts += [f"<p><b>{escape(f.text)}</b>: {escape(f.advice)}</p>" for f in account.findings]
        parts += [f'<div class="note">{escape(n)}</div>' for n in account.notes[:5]]
    if analysis.mfu is not None:
        parts.append(f"<p>{escape(mfu_sentence(analysis.mfu))}</p>")
    if not parts:
        return ""
    return f'<section class="card"><h2>Where the job\'s time went</h2>{"".join(parts)}</section>'
