"""Parse ``--since`` / ``--until``: unix seconds, ISO 8601, ``now``, or an age such as ``90m``."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from traceml_otel.errors import UsageError

DEFAULT_LOOKBACK_S = 24 * 3600.0
"""Search range of a trace backend when ``--since`` is not given."""
_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, slots=True)
class TimeRange:
    """A search range in unix seconds."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise UsageError("the time range is empty: --until must be after --since")


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds from ``1732900000``, ``2026-11-29T18:00:00Z``, ``now`` or an age like ``2h`` (ago).

    ISO times without a zone are UTC.
    """
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    age = _AGE.match(value)
    if age:
        return now - float(age.group(1)) * _UNIT_S[age.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"cannot read the time {text!r}: use unix seconds, ISO 8601, 'now' or an age like 2h"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def time_range(since: str | None, until: str | None, now: float | None = None) -> TimeRange:
    """The range named by ``--since``/``--until`` (default: the last 24 hours)."""
    now = time.time() if now is None else now
    end = parse_time(until, now) if until else now
    start = parse_time(since, now) if since else end - DEFAULT_LOOKBACK_S
    return TimeRange(start, end)


def rfc3339(seconds: float) -> str:
    """``2026-11-29T18:00:00.123456Z``."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
