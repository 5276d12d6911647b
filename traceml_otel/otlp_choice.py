"""Whether and how each signal (traces, metrics) leaves the emitter over OTLP.

:mod:`traceml_otel.settings` reads the ``OTEL_*`` variables (a per-signal one before the general
one) and hands their values here; the OTel SDK's exporters read the rest (headers, timeout,
compression, certificates) inside the emitter process.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from traceml_otel.errors import SettingsError

PROTOCOLS = ("grpc", "http/protobuf")


@dataclass(frozen=True, slots=True)
class SignalExport:
    """How one signal (traces or metrics) leaves the emitter over OTLP."""

    endpoint: str
    protocol: str


def signal_export(exporter: str, endpoint: str, protocol: str) -> SignalExport | None:
    """The signal's OTLP export, or None when its exporter is ``none`` or no endpoint is set.

    ``protocol`` is the configured one (empty when unset); raises :class:`SettingsError` when it is
    not one we export with.
    """
    if exporter.strip().lower() == "none":
        return None
    endpoint = endpoint.strip()
    if not endpoint:
        return None
    return SignalExport(endpoint=endpoint, protocol=choose_protocol(protocol, endpoint))


def choose_protocol(configured: str, endpoint: str) -> str:
    """``configured`` when it is one of :data:`PROTOCOLS`; unset: ``grpc`` for port 4317, else the
    spec default ``http/protobuf``."""
    raw = configured.strip().lower()
    if raw == "http/json":
        raise SettingsError("OTLP protocol http/json is not supported; use grpc or http/protobuf")
    if raw:
        if raw not in PROTOCOLS:
            raise SettingsError(f"OTLP protocol {raw!r} is not one of {', '.join(PROTOCOLS)}")
        return raw
    # Unset: the spec default is http/protobuf, but 4317 is the well-known gRPC port.
    return "grpc" if urlparse(endpoint).port == 4317 else "http/protobuf"
