"""Text and JSON forms of a run comparison."""

from __future__ import annotations

import json
import math

from traceml_otel.analyze.compare_interval import Interval
from traceml_otel.analyze.compare_judged import interval_text
from traceml_otel.analyze.compare_policy import Change, Comparison
from traceml_otel.analyze.compare_summary import RunSummary
from traceml_otel.report.units import PHASE_LABELS, kind_label, seconds, size

COMPARE_SCHEMA = "traceml-otel/compare"
COMPARE_SCHEMA_VERSION = 3
"""2: verdict ``INCONCLUSIVE``, ``basis``, ``work``, per-side work per step. 3: ``interval``,
``cpu_interval``, ``usable``, per-side ``runs`` and ``cpu_wait_share``; verdict ``inconclusive`` of a
change."""


def _signed(change: float | None) -> str:
    return "n/a" if change is None else f"{change * 100:+.1f}%"


def _side(name: str, s: RunSummary) -> str:
    if s.problem:
        return f"{name}: {s.label}  no usable data ({s.problem})"
    if s.members:
        return f"{name}: {s.label}  {len(s.members)} runs pooled, {s.steps} steps in all, {s.clock} clock"
    work = ""
    if s.samples_per_step is not None:
        work = f", {s.samples_per_step:g} samples/step, {seconds(s.time_per_sample)} per sample"
    return (
        f"{name}: {s.label}  run {s.run_id or '?'}  {kind_label(s.kind)} [{s.severity}]  "
        f"{s.steps} steps, {s.clock} clock, step time {seconds(s.step_time)}{work}"
    )


def _row(label: str, change: Change, fmt) -> str:
    material = " (material)" if change.material else ""
    return (
        f"{label:<12} {fmt(change.before):>10} -> {fmt(change.after):>10}  {_signed(change.change):>8}  "
        f"{change.verdict}{material}"
    )


def render_comparison_text(comparison: Comparison) -> str:
    """The comparison as a short text card and a table."""
    c = comparison
    headline = c.verdict + (" (material)" if c.material else "")
    lines = [
        "traceml-otel compare",
        _side("A", c.a),
        _side("B", c.b),
        "",
        f"Verdict      {headline}" + (f"  (time per {c.basis})" if c.work is not None else ""),
    ]
    if c.interval is not None:
        lines += _interval_lines(c)
    if c.work is not None:
        on_cpu = c.interval is not None and c.interval.name.startswith("on_cpu")
        lines.append(_row(f"per {c.basis}" + (" CPU" if on_cpu else ""), c.work, seconds))
    lines += [
        _row("step time", c.step_time, seconds),
        _row("peak memory", c.memory, lambda v: size(v) if v is not None else "n/a"),
        f"{'diagnosis':<12} {kind_label(c.a.kind)} -> {kind_label(c.b.kind)}: {c.diagnosis}",
    ]
    lines += _shares(c.a, c.b)
    if c.phases:
        lines += ["", f"Phases ({c.a.clock} clock, mean per step)"]
        lines += [_row(PHASE_LABELS[p.name], p, seconds) for p in c.phases]
    lines += [f"Note: {note}" for note in c.notes]
    return "\n".join(lines) + "\n"


def _interval_lines(c: Comparison) -> list[str]:
    """The deciding interval (and the wall one beside it) with the method."""
    assert c.interval is not None
    unit = c.basis
    on_cpu = c.interval.name.startswith("on_cpu")
    lines = []
    for label, interval in (("wall", c.wall), ("on-CPU", c.cpu)):
        if interval is not None:
            decides = "  <- decides" if (label == "on-CPU") == on_cpu else ""
            if decides and c.interval.load_confounded:  # the machines' loads differed (a note says how)
                decides = "  <- not judged: the machine's load differed"
            lines.append(f"{label:<12} {interval_text(interval)}  per {unit}: {interval.verdict}  "
                         f"(95 % interval){decides}")
    lines.append(f"{'method':<12} {c.interval.method}")
    return lines


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _shares(a: RunSummary, b: RunSummary) -> list[str]:
    """Goodput and MFU lines (information: they never decide the verdict); none when neither has them."""
    lines = []
    for label, before, after in (("goodput", a.goodput, b.goodput), ("MFU", a.mfu, b.mfu)):
        if before is None and after is None:
            continue
        change = "" if before is None or after is None else f"  {(after - before) * 100:+.1f} points"
        lines.append(f"{label:<12} {_share(before):>10} -> {_share(after):>10}{change}")
    return lines


def _change_json(change: Change) -> dict[str, object]:
    return {
        "name": change.name,
        "before": change.before,
        "after": change.after,
        "change": change.change,
        "verdict": change.verdict,
        "material": change.material,
    }


def interval_json(interval: Interval | None) -> dict[str, object] | None:
    if interval is None:
        return None
    return {
        "name": interval.name, "before": interval.before, "after": interval.after, "change": interval.change,
        "low": interval.low, "high": interval.high, "half_width": interval.half_width,
        "confidence": 0.95, "verdict": interval.verdict, "method": interval.method,
        "between_runs": interval.between_runs,
    }


def _side_json(s: RunSummary) -> dict[str, object]:
    from traceml_otel.analyze.compare_sides import wait_share

    return {
        "runs": [r.label for r in s.members] or [s.label],
        "cpu_wait_share": wait_share(s),
        "label": s.label,
        "run_id": s.run_id,
        "kind": s.kind,
        "severity": s.severity,
        "clock": s.clock,
        "steps": s.steps,
        "step_time_s": s.step_time,
        "peak_memory_bytes": s.peak_memory,
        "samples_per_step": s.samples_per_step,
        "time_per_sample_s": s.time_per_sample,
        "tokens_per_step": s.tokens_per_step,
        "time_per_token_s": s.time_per_token,
        "problem": s.problem or None,
        "goodput": s.goodput,
        "mfu": s.mfu,
    }


def render_comparison_json(comparison: Comparison) -> str:
    """The comparison as versioned JSON (see docs/report-schema.md)."""
    c = comparison
    document = {
        "schema": COMPARE_SCHEMA,
        "schema_version": COMPARE_SCHEMA_VERSION,
        "verdict": c.verdict,
        "material": c.material,
        "usable": c.usable,
        "interval": interval_json(c.interval),
        "cpu_interval": interval_json(c.cpu),
        "wall_interval": interval_json(c.wall),
        "basis": c.basis,
        "work": _change_json(c.work) if c.work is not None else None,
        "a": _side_json(c.a),
        "b": _side_json(c.b),
        "step_time": _change_json(c.step_time),
        "peak_memory": _change_json(c.memory),
        "diagnosis": {"before": c.a.kind, "after": c.b.kind, "verdict": c.diagnosis},
        "phases": [_change_json(p) for p in c.phases],
        "notes": list(c.notes),
    }
    try:
        return json.dumps(document, indent=2, allow_nan=False) + "\n"
    except ValueError:  # a NaN or infinity from a bad input: null, never a non-standard token
        return json.dumps(_finite(document), indent=2, allow_nan=False) + "\n"


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
