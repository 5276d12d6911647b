"""The OpenTelemetry consistent probability sampling threshold (``th`` in ``tracestate`` ``ot=...``).

A trace is in a sample of probability ``p`` when its randomness value ``R`` (the trace id's low 56
bits, or an explicit ``rv``) is at or above the threshold ``T = (1 - p) * 2**56``; ``th`` writes ``T``
in 14 hex digits with trailing zeros removed (``th:0``: probability 1). A kept item stands for
``2**56 / (2**56 - T)`` items (its adjusted count). Used by the emitter's span budget
(:mod:`traceml_otel.emit.span_budget`) and by the analyzer's re-weighting; no dependencies.
"""

from __future__ import annotations

BITS = 1 << 56
LOW56 = BITS - 1


def threshold(probability: float) -> int:
    """The 56-bit rejection threshold ``T`` of ``probability`` (``0 < p <= 1``): keep when ``R >= T``."""
    return min(LOW56, max(0, BITS - round(probability * BITS)))  # p * 2**56 is exact in binary


def threshold_hex(value: int) -> str:
    """``th`` as the spec writes it: 14 hex digits, trailing zeros removed (``0``: always kept)."""
    return f"{value:014x}".rstrip("0") or "0"


def adjusted_count(th: str) -> float | None:
    """``1/p`` of a ``th`` value (``None``: not a valid threshold)."""
    if not th or len(th) > 14 or any(ch not in "0123456789abcdef" for ch in th):
        return None
    value = int(th.ljust(14, "0"), 16)
    return BITS / (BITS - value)


def trace_state_threshold(trace_state: str) -> str | None:
    """The ``th`` value of an ``ot=...`` tracestate entry, if there is one."""
    for member in trace_state.split(","):
        key, _, value = member.strip().partition("=")
        if key == "ot":
            for part in value.split(";"):
                name, _, th = part.partition(":")
                if name == "th":
                    return th
    return None


def in_sample(trace_id: int, threshold_value: int) -> bool:
    """The consistent decision: the trace id's low 56 bits at or above the threshold."""
    return (trace_id & LOW56) >= threshold_value
