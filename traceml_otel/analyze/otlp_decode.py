"""OTLP JSON as trace backends and files spell it, normalised.

Accepts what real producers write: hex or base64 ids (Tempo trims leading zeros of hex trace
ids), ``resourceSpans`` or Tempo's ``batches``, the ``{"trace": ...}`` and ``{"result": ...}``
wrappers, camelCase or snake_case keys, 64-bit integers as strings or numbers, and enums as
integers or names.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping

from traceml_otel.errors import TracemlError

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_ENVELOPE_KEYS = ("trace", "result")
_RESOURCE_SPANS_KEYS = ("resourceSpans", "resource_spans", "batches")
_SCOPE_SPANS_KEYS = ("scopeSpans", "scope_spans", "instrumentationLibrarySpans")
STATUS_ERROR_VALUES = frozenset({2, "2", "STATUS_CODE_ERROR", "ERROR", "error"})


class ForeignDocument(TracemlError, ValueError):
    """A JSON document that is valid but holds no OTLP traces."""


def normalize_id(raw: object, n_bytes: int) -> str:
    """Return a lower-case hex id of ``n_bytes`` bytes from a hex or base64 spelling.

    A string of hex digits only is hex (left-padded: Tempo's search drops leading zeros);
    anything else is base64, as protobuf's JSON mapping writes bytes. Returns ``""`` when
    ``raw`` cannot be decoded.
    """
    if not isinstance(raw, str) or not raw:
        return ""
    width = 2 * n_bytes
    if len(raw) <= width and _HEX_DIGITS.issuperset(raw):
        return raw.lower().rjust(width, "0")
    try:
        decoded = base64.b64decode(
            raw + "=" * (-len(raw) % 4), altchars=b"-_" if "-" in raw or "_" in raw else None
        )
    except (binascii.Error, ValueError):
        return ""
    if len(decoded) != n_bytes:
        return ""
    return decoded.hex()


def trace_id_hex(raw: object) -> str:
    """A 16-byte trace id as 32 hex digits (``""`` if undecodable)."""
    return normalize_id(raw, 16)


def span_id_hex(raw: object) -> str:
    """An 8-byte span id as 16 hex digits (``""`` if undecodable)."""
    return normalize_id(raw, 8)


def decode_attributes(attributes: list, wanted: frozenset[str]) -> dict[str, object]:
    """Raw payloads of the ``wanted`` keys of an OTLP attribute list; other keys are skipped.

    The hot loop of every read: it assumes well-formed items (``{"key": ..., "value": {...}}``) and
    lets ``KeyError``/``TypeError``/``AttributeError`` escape for the caller to report.
    """
    out: dict[str, object] = {}
    for item in attributes:
        key = item["key"]
        if key in wanted:
            for out[key] in item["value"].values():  # the single payload of the AnyValue
                break
    return out


def as_int(raw: object) -> int | None:
    """An OTLP integer (a JSON number or a decimal string) or ``None``.

    OTLP JSON writes 64-bit integers as strings, so these readers accept them; the record readers of
    the same names in ``wire/_json.py`` do not (our own files hold JSON numbers).
    """
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int):
        return raw
    try:
        return int(raw)
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400 is an infinite float
        try:
            number = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return None
        return int(number) if number.is_integer() else None


def as_int_list(raw: object, limit: int) -> tuple[int, ...] | None:
    """An OTLP array of integers (``{"values": [{"intValue": ...}, ...]}`` or a plain list), at most
    ``limit`` long; ``None`` when absent, longer, or any item is not an integer."""
    items = raw.get("values") if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items or len(items) > limit:
        return None
    values = []
    for item in items:
        if isinstance(item, dict):
            item = next(iter(item.values()), None)
        number = as_int(item)
        if number is None:
            return None
        values.append(number)
    return tuple(values)


def as_float(raw: object) -> float | None:
    """An OTLP double (number or string, ``"NaN"`` rejected) or ``None``."""
    if isinstance(raw, bool) or raw is None:
        return None
    try:
        number = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


MAX_SECONDS = 1e7
"""Largest duration (about 116 days, either sign) read as real; beyond it a value is bad data."""


def as_seconds(raw: object) -> float | None:
    """An OTLP double within :data:`MAX_SECONDS` of zero (a duration, or a difference of two), or ``None``."""
    number = as_float(raw)
    return number if number is not None and -MAX_SECONDS <= number <= MAX_SECONDS else None


def as_str(raw: object) -> str | None:
    """An OTLP string value, or ``None``."""
    return raw if isinstance(raw, str) else None


def resource_spans(document: object) -> list[dict]:
    """The ``ResourceSpans`` list of any supported envelope; raises :class:`ForeignDocument`."""
    if isinstance(document, list):
        found: list[dict] = []
        for item in document:
            found.extend(resource_spans(item))
        return found
    if not isinstance(document, dict):
        raise ForeignDocument("not a JSON object")
    for key in _RESOURCE_SPANS_KEYS:
        if key in document:
            value = document[key]
            return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
    for key in _ENVELOPE_KEYS:
        if isinstance(document.get(key), (dict, list)):
            return resource_spans(document[key])
    if not document:
        return []
    raise ForeignDocument(f"no OTLP traces (keys: {', '.join(sorted(map(str, document))[:4])})")


def scope_spans(resource: Mapping) -> Iterator[list]:
    """Each scope's span list inside one ``ResourceSpans``."""
    for key in _SCOPE_SPANS_KEYS:
        scopes = resource.get(key)
        if isinstance(scopes, list):
            for scope in scopes:
                spans = scope.get("spans") if isinstance(scope, dict) else None
                if isinstance(spans, list):
                    yield spans
            return


def span_field(span: Mapping, camel: str, snake: str) -> object:
    """A span field by its camelCase name or, failing that, its snake_case name."""
    value = span.get(camel)
    return span.get(snake) if value is None else value


def is_error_status(span: Mapping) -> bool:
    """True when the span's status code is ERROR (integer or name spelling)."""
    status = span.get("status")
    if not isinstance(status, dict):
        return False
    code = status.get("code")
    return code in STATUS_ERROR_VALUES
