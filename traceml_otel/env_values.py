"""Typed values from environment strings: the parsers every setting goes through.

Each takes the environment mapping and a variable's name, drops surrounding blanks, returns the
default when the variable is unset or blank, and raises :class:`~traceml_otel.errors.SettingsError`
naming the variable when its value is unusable. :mod:`traceml_otel.settings` names the variables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from traceml_otel.errors import SettingsError


def flag(env: Mapping[str, str], name: str) -> bool:
    """True for ``1``/``true``/``yes``/``on`` (any case); anything else, unset included, is False."""
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def whole_number(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    """A whole number (a count, a port, milliseconds) of at least ``minimum``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    return value


def decimal(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    """A finite decimal (a duration in seconds, a factor) of at least ``minimum``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} is not a finite number")
    if value < minimum:
        raise SettingsError(f"{name}={raw} must be >= {minimum:g}")
    return value
