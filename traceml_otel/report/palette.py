"""One colour per phase and per time category, for every HTML chart.

A phase keeps its colour wherever it is drawn: the phase bars (``input_wait``) and the time account
(``step.input_wait``) show input wait in the same amber, and no category borrows a phase's colour
(start-up is brown, never forward's blue). Ranks in the line charts take :data:`RANK_COLORS`, a
separate set: a rank is not a category.
"""

from __future__ import annotations

PHASE_COLORS = {
    "input_wait": "#f59e0b",
    "h2d": "#06b6d4",
    "forward": "#2563eb",
    "backward": "#db2777",
    "optimizer": "#10b981",
    "communication": "#ef4444",
    "residual": "#9ca3af",
}
"""The step's phases (``traceml.phase.*``): the same colour in every chart."""

CATEGORY_COLORS = {
    "startup": "#92400e",
    "restarts": "#7c3aed",
    "redone_steps": "#c4b5fd",
    "between_steps": "#e7e5e4",
    "stalled": "#111827",
    "shutdown": "#78716c",
    "telemetry": "#0f766e",
    "outside.evaluation": "#a3e635",
    "outside.checkpoint": "#1e3a8a",
}
"""Time-account categories that are not a step's phase."""

_OTHER_KINDS = ("#fb7185", "#fcd34d", "#5eead4", "#818cf8", "#f0abfc", "#bef264", "#fdba74", "#67e8f9")
"""Further ``outside_step`` kinds, in order of first appearance in one chart."""

RANK_COLORS = (
    "#1e40af", "#b91c1c", "#047857", "#b45309", "#6d28d9", "#0e7490",
    "#be185d", "#4d7c0f", "#374151", "#c2410c", "#115e59", "#7e22ce",
)
"""Lines of the per-rank charts (step time, memory): darker shades, none a phase's or category's."""


def phase_color(name: str) -> str:
    """The colour of a phase (``input_wait``)."""
    return PHASE_COLORS[name]


def category_colors(names: list[str]) -> list[str]:
    """The colour of each time-account category, in order: ``step.<phase>`` takes its phase's colour,
    known categories their own, other ``outside_step`` kinds the next unused extra colour."""
    extra = iter(_OTHER_KINDS)
    colors = []
    for name in names:
        phase = name.removeprefix("step.")
        if name.startswith("step.") and phase in PHASE_COLORS:
            colors.append(PHASE_COLORS[phase])
        elif name in CATEGORY_COLORS:
            colors.append(CATEGORY_COLORS[name])
        else:
            colors.append(next(extra, "#d1d5db"))
    return colors
