"""Inline SVG charts with no scripts: a multi-line chart and horizontal stacked bars.

Every label passes through :func:`html.escape`; numbers are formatted by the caller's function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

FONT = 'font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="12"'
MAX_LEGEND = 16


@dataclass(frozen=True, slots=True)
class Line:
    """One polyline: its legend label, colour and points."""

    label: str
    color: str
    xs: Sequence[float]
    ys: Sequence[float]


@dataclass(frozen=True, slots=True)
class BarRow:
    """One horizontal bar: a label and one value per segment (``None`` = not measured)."""

    label: str
    values: Sequence[float | None]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _legend(items: Sequence[tuple[str, str]], x: float, y: float, width: float) -> tuple[str, float]:
    """Legend swatches laid out in rows; returns the SVG and the height used."""
    parts = []
    cursor_x, cursor_y = x, y
    shown = list(items[:MAX_LEGEND])
    if len(items) > MAX_LEGEND:
        shown.append((f"+{len(items) - MAX_LEGEND} more", "#9ca3af"))
    for label, color in shown:
        item_width = 26 + 7 * len(label)
        if cursor_x + item_width > x + width:
            cursor_x, cursor_y = x, cursor_y + 18
        swatch = f'x="{cursor_x:.0f}" y="{cursor_y - 9:.0f}" width="12" height="12" rx="2"'
        parts.append(
            f'<rect {swatch} fill="{escape(color)}"/>'
            f'<text x="{cursor_x + 17:.0f}" y="{cursor_y + 1:.0f}" {FONT} fill="#374151">'
            f"{escape(label)}</text>"
        )
        cursor_x += item_width
    return "".join(parts), cursor_y - y + 18


def line_chart(
    lines: Sequence[Line],
    *,
    y_format: Callable[[float], str],
    x_label: str,
    title: str,
    marker: tuple[float, str] | None = None,
    width: int = 1000,
    height: int = 280,
) -> str:
    """Lines over a shared x axis, y from zero, with an optional labelled vertical marker.

    The marker's label sits in a band of its own above the plot, so it never covers a line."""
    left, right, top, bottom = 72, 16, 28 if marker is None else 46, 40
    xs = [x for line in lines for x in line.xs]
    ys = [y for line in lines for y in line.ys]
    if not xs:
        return ""
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    y_ticks = nice_ticks(0.0, max(ys) * 1.05 or 1.0)
    y_hi = y_ticks[-1]
    legend, legend_height = _legend(
        [(line.label, line.color) for line in lines], left, height + 14, width - left
    )
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y / y_hi * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height + legend_height + 8}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="16" {FONT} font-weight="600" fill="#111827">{escape(title)}</text>',
    ]
    for tick in y_ticks:
        y = py(tick)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" {FONT} text-anchor="end" fill="#6b7280">'
            f"{escape(y_format(tick))}</text>"
        )
    for tick in nice_ticks(x_lo, x_hi, 8):
        if x_lo <= tick <= x_hi:
            x = px(tick)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" '
                'stroke="#9ca3af"/>'
            )
            parts.append(
                f'<text x="{x:.1f}" y="{top + plot_h + 17}" {FONT} text-anchor="middle" fill="#6b7280">'
                f"{tick:g}</text>"
            )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 4}" {FONT} text-anchor="middle" fill="#374151">'
        f"{escape(x_label)}</text>"
    )
    parts.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#9ca3af"/>'
    )
    for line in lines:
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(line.xs, line.ys, strict=True))
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{escape(line.color)}" stroke-width="1.6" '
            'stroke-linejoin="round"/>'
        )
    if marker is not None and x_lo <= marker[0] <= x_hi:
        parts.append(_marker(px(marker[0]), marker[1], top, plot_h, left + plot_w * 0.75))
    parts.append(legend)
    parts.append("</svg>")
    return "".join(parts)


def _marker(x: float, label: str, top: float, height: float, flip_after: float) -> str:
    """A dashed vertical line from the label band above the plot down to the axis; the label beside
    the line's top (left of it near the right edge), above every plotted line."""
    anchor, offset = ("end", -6) if x > flip_after else ("start", 6)
    return (
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 14}" y2="{top + height}" stroke="#b45309" '
        'stroke-dasharray="5 4"/>'
        f'<text x="{x + offset:.1f}" y="{top - 6:.1f}" {FONT} text-anchor="{anchor}" '
        'fill="#92400e" '
        f'stroke="#ffffff" stroke-width="4" paint-order="stroke">{escape(label)}</text>'
    )


def stacked_bars(
    rows: Sequence[BarRow],
    segments: Sequence[tuple[str, str]],
    *,
    value_format: Callable[[float], str],
    title: str,
    width: int = 1000,
) -> str:
    """One horizontal bar per row, split into coloured segments, with its total at the end."""
    left, right, top, bar, gap = 90, 90, 30, 18, 8
    totals = [sum(v for v in row.values if v is not None) for row in rows]
    scale = max(totals, default=0.0) or 1.0
    plot_w = width - left - right
    body_height = top + len(rows) * (bar + gap)
    legend, legend_height = _legend(segments, left, body_height + 10, plot_w)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {body_height + legend_height + 8}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="16" {FONT} font-weight="600" fill="#111827">{escape(title)}</text>',
    ]
    for index, (row, total) in enumerate(zip(rows, totals, strict=True)):
        y = top + index * (bar + gap)
        parts.append(
            f'<text x="{left - 8}" y="{y + 13}" {FONT} text-anchor="end" fill="#374151">'
            f"{escape(row.label)}</text>"
        )
        x = float(left)
        for value, (name, color) in zip(row.values, segments, strict=True):
            if not value:
                continue
            w = value / scale * plot_w
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar}" fill="{escape(color)}">'
                f"<title>{escape(name)}: {escape(value_format(value))}</title></rect>"
            )
            x += w
        parts.append(
            f'<text x="{x + 6:.1f}" y="{y + 13}" {FONT} fill="#374151">{escape(value_format(total))}</text>'
        )
    parts.append(legend)
    parts.append("</svg>")
    return "".join(parts)
