"""Keep OTLP header values (tokens) out of everything the emitter prints.

The OTel SDK logs a malformed ``OTEL_EXPORTER_OTLP_HEADERS`` whole, token included. The emitter
therefore redacts, at the moment a log record is made, every header value found in the
environment, and runs its own messages through the same filter. Header names stay visible so the
user can tell which header is wrong.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

HEADER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
)
REDACTED = "[redacted]"
_MIN_TOKEN = 3


def header_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """Every string that may be (part of) a header value: the raw variables, each value, its words."""
    env = os.environ if env is None else env
    secrets: set[str] = set()
    for name in HEADER_VARIABLES:
        raw = env.get(name, "").strip()
        if not raw:
            continue
        secrets.add(raw)
        for item in raw.split(","):
            item = item.strip()
            _, separator, value = item.partition("=")
            if not separator:
                _, separator, value = item.partition(":")
            candidates = [value] if separator else [item]
            for candidate in candidates:
                candidate = candidate.strip()
                secrets.add(candidate)
                secrets.update(word for word in re.split(r"[\s%]+", candidate) if word)
    return sorted((s for s in secrets if len(s) >= _MIN_TOKEN), key=len, reverse=True)


class Redactor:
    """Replaces every known secret in a text with ``[redacted]``."""

    def __init__(self, secrets: list[str]) -> None:
        self._pattern = re.compile("|".join(map(re.escape, secrets))) if secrets else None

    def __call__(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(REDACTED, text)


def install_log_redaction(redact: Redactor) -> None:
    """Redact every log record of this process when it is made (the SDK's loggers included)."""
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the raw message, redacted
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return record

    logging.setLogRecordFactory(factory)
