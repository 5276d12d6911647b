"""The live panel: a :class:`~traceml_otel.report.live_view.LiveSnapshot` as a compact ``rich`` renderable.

About 16 lines whatever the world size: a header (run, ranks reporting, steps, rates), a table of step
time and the phase split (median, min and max across ranks with the rank at each end, the median share
of the step, the slowest ranks), then goodput, memory, the window's verdict and the flags. Every text
that came from a file is stripped of control characters and shown as plain text (never rich markup).
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from traceml_otel.report.live_view import LiveSnapshot, Spread, flag_sentences, gib, ms, pct
from traceml_otel.sanitize import strip_control

_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "green"}
_PHASE_LABEL = {"input": "input wait", "h2d": "H2D copies", "fwd": "forward", "bwd": "backward",
                "opt": "optimizer", "comm": "exposed comm", "residual": "residual"}


def _end(spread: Spread | None, high: bool) -> str:
    if spread is None:
        return "-"
    value, rank = (spread.high, spread.high_rank) if high else (spread.low, spread.low_rank)
    return f"{ms(value)} r{rank}"


def _text(text: str, style: str = "") -> Text:
    return Text(strip_control(text), style=style)


def render_panel(snap: LiveSnapshot, source: str = "") -> RenderableType:
    """The panel for one snapshot (``source``: where it was read, shown in the header)."""
    world = max(snap.world_size, snap.ranks_seen)
    steps = snap.steps
    head = (f"traceml live  run {snap.run_id or '-'}  ranks {snap.reporting}/{world} reporting  "
            f"steps {int(steps.median) if steps else 0:,}"
            + (f" (min {int(steps.low):,} r{steps.low_rank})" if steps and steps.low != steps.high else "")
            + (f"  {snap.steps_per_s:.3g} steps/s" if snap.steps_per_s else "")
            + (f"  {snap.samples_per_s:,.0f} samples/s" if snap.samples_per_s else "")
            + f"  {time.strftime('%H:%M:%S', time.localtime(snap.at))}" + ("  ENDED" if snap.ended else "")
            + (f"  {source}" if source else ""))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for name, justify in (("last 100 steps (ms)", "left"), ("median", "right"), ("min", "right"),
                          ("max", "right"), ("share", "right"), ("slowest ranks", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    median = snap.step_median
    table.add_row("step time", ms(median.median if median else None), _end(median, False), _end(median, True),
                  "", " ".join(f"r{rank} {ms(value)}" for rank, value in snap.slowest) or "-")
    p95 = snap.step_p95
    table.add_row("step time p95", ms(p95.median if p95 else None), _end(p95, False), _end(p95, True), "", "")
    for short, spread, share in snap.phases:
        table.add_row(f"  {_PHASE_LABEL.get(short, short)}", ms(spread.median if spread else None),
                      _end(spread, False), _end(spread, True), pct(share), "")
    between = snap.between
    table.add_row("between steps", ms(between.median if between else None), _end(between, False),
                  _end(between, True), "", "")
    lines: list[RenderableType] = [_text(head, "bold"), table]
    extras = []
    if snap.outside:
        extras.append("outside_step " + ", ".join(f"{kind} {s:.1f}s ({n})" for kind, s, n in snap.outside))
    good = snap.goodput
    extras.append(f"goodput so far {pct(good.median if good else None)}"
                  + (f" (min {pct(good.low)} r{good.low_rank})" if good and good.low != good.high else "")
                  + f"   MFU {pct(snap.mfu.median) if snap.mfu else '- (FLOPs or peak unknown)'}")
    if snap.memory_peak:
        peak, rank, total = snap.memory_peak
        extras.append(f"CUDA peak {gib(peak)} r{rank}" + (f" of {gib(total)}, headroom {gib(total - peak)}"
                                                          if total else ""))
    lines += [_text(line) for line in extras]
    style = _SEVERITY_STYLE.get(snap.verdict_severity, "")
    lines.append(Text.assemble(("verdict ", "bold"), (strip_control(snap.verdict), style),
                               ("  " + strip_control(snap.verdict_why), "")))
    flags = flag_sentences(snap)
    lines += [_text(line, "bold red") for line in flags] or [_text("flags none; telemetry: no drops", "dim")]
    return Group(*lines)
