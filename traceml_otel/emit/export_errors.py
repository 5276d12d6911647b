"""Why an OTLP export failed, in words: connection refused, wrong protocol, timeout, HTTP status.

The SDK exporters return a bare ``FAILURE`` and log the cause. We keep their log records (instead
of printing every retry) and read the cause from the records of the thread that exported. The
phrases below match what the ``opentelemetry-exporter-otlp-proto-{grpc,http}`` exporters log
(see ``tests/emit/test_export_errors.py``, which provokes each case against real sockets).
"""

from __future__ import annotations

import collections
import logging
import re
import socket
import threading
from urllib.parse import urlparse

EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp", "opentelemetry.sdk.metrics")
_HTTP_STATUS = re.compile(r"code: (\d{3}), reason: ([^,;]{0,60})")
_USERINFO = re.compile(r"//[^/@\s]+@")


class ExporterLogRecorder(logging.Handler):
    """Keeps the last exporter log messages per thread; nothing reaches stderr."""

    def __init__(self, keep: int = 8) -> None:
        super().__init__(logging.WARNING)
        self._keep = keep
        self._lock_messages = threading.Lock()
        self._messages: dict[int, collections.deque[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record must not break export
            return
        with self._lock_messages:
            kept = self._messages.setdefault(record.thread or 0, collections.deque(maxlen=self._keep))
            kept.append(message)

    def peek(self, thread: int) -> list[str]:
        """The messages logged on ``thread`` since the last take, left in place."""
        with self._lock_messages:
            return list(self._messages.get(thread, ()))

    def take(self, thread: int | None = None) -> list[str]:
        """The messages logged on ``thread`` (default: this one) since the last take."""
        with self._lock_messages:
            found = self._messages.pop(thread or threading.get_ident(), None)
        return list(found or ())


_recorder: ExporterLogRecorder | None = None


def install_log_recorder() -> ExporterLogRecorder:
    """Route the SDK exporters' logs into one recorder (idempotent)."""
    global _recorder
    if _recorder is None:
        _recorder = ExporterLogRecorder()
        for name in EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(_recorder)
            logger.setLevel(logging.WARNING)
            logger.propagate = False
    return _recorder


def probe_endpoint(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """``connection refused`` or ``timeout`` when a TCP connect to the endpoint fails; else ``None``."""
    parsed = urlparse(endpoint if "//" in endpoint else f"//{endpoint}")
    port = parsed.port or (443 if parsed.scheme == "https" else 4318 if parsed.scheme == "http" else 4317)
    try:
        with socket.create_connection((parsed.hostname or "localhost", port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused (nothing listens at that address)"
    except TimeoutError:
        return "timeout (no answer to a TCP connect within 1 s)"
    except OSError as error:
        return f"cannot connect ({error.strerror or type(error).__name__})"


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
WRONG_PROTOCOL_HTTP = (
    "wrong protocol: the endpoint answered HTTP/1, not gRPC (OTLP over HTTP usually listens on 4318; "
    "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)")
WRONG_PROTOCOL_GRPC = (
    "wrong protocol: the endpoint speaks HTTP/2 (gRPC), not HTTP/1 (OTLP over gRPC usually listens on 4317; "
    "set OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")


def probe_protocol(endpoint: str, protocol: str, timeout_s: float = 1.0) -> str | None:
    """Why OTLP over ``protocol`` cannot work at ``endpoint``, from one short exchange; ``None`` when it
    connects and answers in that protocol (or the answer is not clear: nothing is claimed then).

    A TCP connect (refused, timeout), then the start of the protocol: the HTTP/2 preface for gRPC
    (a text reply means an HTTP/1 server), a ``HEAD`` request for HTTP (a binary HTTP/2 frame or no
    reply at all means a gRPC server). Over TLS (``https``) only the connect is tried.
    """
    refused = probe_endpoint(endpoint, timeout_s)
    if refused is not None or endpoint.startswith("https"):
        return refused
    parsed = urlparse(endpoint if "//" in endpoint else f"//{endpoint}")
    port = parsed.port or (4318 if parsed.scheme == "http" and protocol != "grpc" else 4317)
    host = parsed.hostname or "localhost"
    grpc = protocol == "grpc"
    head = f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    request = _HTTP2_PREFACE if grpc else head
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.settimeout(timeout_s)
            connection.sendall(request)
            reply = connection.recv(16)
    except OSError:
        return None  # a reset or a slow answer says nothing sure about the protocol
    if grpc:  # an HTTP/2 frame starts with its 3-byte length (a 0 byte first); HTTP/1 with text
        return WRONG_PROTOCOL_HTTP if reply and reply[0] >= 0x20 else None
    if reply.startswith(b"HTTP/"):
        return None
    return WRONG_PROTOCOL_GRPC if not reply or (len(reply) >= 4 and reply[3] in (0x04, 0x07)) else None


def endpoint_level(cause: str) -> bool:
    """A cause about the endpoint itself (nothing listens, the other protocol, no answer), as
    :func:`probe_protocol` and :func:`failure_cause` word them."""
    return cause.startswith(
        ("connection refused", "wrong protocol", "timeout", "cannot connect", "host name"))


def failure_cause(messages: list[str], protocol: str, endpoint: str | None = None) -> str:
    """One phrase for why export failed, from the exporter's log messages.

    When they do not say (the HTTP exporter only reports "timeout, max retries or shutdown" once its
    deadline is spent), a TCP connect to ``endpoint`` tells a refused connection from a timeout.
    """
    text = " ".join(messages)
    status = _HTTP_STATUS.search(text)
    if status:
        return f"HTTP {status.group(1)} {status.group(2).strip()}".strip()
    if "Failed parsing HTTP/2" in text or "Expected SETTINGS frame" in text:
        return WRONG_PROTOCOL_HTTP
    if any(mark in text for mark in ("RemoteDisconnected", "BadStatusLine", "Connection aborted",
                                     "Connection reset", "ProtocolError")):
        return ("wrong protocol? the endpoint closed the connection without an HTTP answer (OTLP over gRPC "
                "usually listens on 4317; set OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
    if "Connection refused" in text or "ConnectionRefused" in text:
        return "connection refused (nothing listens at that address)"
    probed = probe_endpoint(endpoint) if endpoint else None
    if probed:
        return probed
    if any(mark in text for mark in ("DEADLINE_EXCEEDED", "timed out", "Timeout", "timeout")):
        return "timeout (no answer within OTEL_EXPORTER_OTLP_TIMEOUT)"
    if any(mark in text for mark in ("Name or service not known", "nodename nor servname", "DNS resolution")):
        return "host name not found"
    if "UNAVAILABLE" in text:
        return "endpoint unavailable (gRPC UNAVAILABLE)"
    if messages:
        return _USERINFO.sub("//***@", messages[-1])[:160]
    return f"the {protocol} exporter reported FAILURE without a reason"
