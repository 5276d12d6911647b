"""Typed values from environment strings: the parsers every setting goes through.

Each takes the environment mapping and a variable's name, drops surrounding blanks, returns the
default when the variable is unset or blank, and raises :class:`~traceml_otel.errors.SettingsError`
naming the variable when its value is unusable. :mod:`traceml_otel.settings` names the variables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from traceml_otel.errors import SettingsError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    """Every boolean ``TRACEML_*`` variable: True for ``1``/``true``/``yes``/``on``, False for
    ``0``/``false``/``no``/``off`` (any case), ``default`` unset or blank; any other value is a
    :class:`SettingsError` (a typo must read neither as on nor as off)."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ON:
        return True
    if raw in OFF:
        return False
    raise SettingsError(f"{name}={raw[:20]!r} is neither 1 nor 0")


def otel_true(env: Mapping[str, str], name: str) -> bool:
    """An ``OTEL_*`` boolean (``OTEL_SDK_DISABLED``) as the OpenTelemetry specification reads it: true
    only for ``true`` (any case); any other value is false."""
    return env.get(name, "").strip().lower() == "true"


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
