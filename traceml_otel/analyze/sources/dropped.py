"""What a metrics reader left out of the answers, by reason, for the report: never dropped silently.

``2 series dropped: non-numeric rank label (traceml_rank -5, 1e3)``; a series counts once per rank
label and reason, however many queries returned it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from traceml_otel.sanitize import one_line

MAX_LABELS = 100_000
"""Rank labels kept per reason (the count stops growing there)."""


@dataclass(slots=True)
class DroppedSeries:
    """Series and range samples left out, by reason."""

    series: dict[str, set[str]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)

    def add_series(self, reason: str, rank_label: object) -> None:
        labels = self.series.setdefault(reason, set())
        if len(labels) < MAX_LABELS:
            labels.add(one_line(rank_label)[:24] if rank_label is not None else "(none)")

    def add_sample(self, reason: str) -> None:
        self.samples[reason] = self.samples.get(reason, 0) + 1

    def lines(self, rank_label: str) -> list[str]:
        """One warning per reason."""
        said = []
        for reason, labels in sorted(self.series.items()):
            shown = ", ".join(sorted(labels)[:3]) + (", ..." if len(labels) > 3 else "")
            said.append(f"{len(labels)} series dropped: {reason} ({rank_label} {shown})")
        for reason, count in sorted(self.samples.items()):
            said.append(f"{count} samples of the series over the run dropped: {reason}")
        return said


def value_problem(pair: object) -> str:
    """Why a ``[timestamp, "value"]`` pair was not read: a non-finite number, or no number at all."""
    raw = pair[1] if isinstance(pair, list) and len(pair) == 2 else None
    try:
        number = float(raw) if isinstance(raw, str) and len(raw) <= 40 else None
    except ValueError:
        number = None
    if number is not None and not math.isfinite(number):
        return "value not finite (NaN or Inf)"
    return "value not a number"


def rank_problem(raw: object, max_rank: int) -> str:
    """Why a rank label is not a rank: missing, not a whole number, or beyond ``max_rank``."""
    if raw is None:
        return "no rank label"
    digits = isinstance(raw, str) and raw.isascii() and raw.isdigit()
    return f"rank label above {max_rank}" if digits else "non-numeric rank label"
