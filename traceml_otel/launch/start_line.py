"""The one line a job prints when it starts: run id, run folder, where telemetry goes, how to watch it.

``traceml run`` prints it from the launcher; a direct launch (``TRACEML_AUTO=1 torchrun ...``,
``python train.py`` with ``init()``) prints it from the process of local rank 0 at ``init()``, on the
first attempt only. Endpoints are shown without credentials: a password in a URL and every OTLP header
value are redacted (``sanitize.redact_argv``, ``emit/redact.py``), and control characters are stripped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from traceml_otel.emit.redact import Redactor, header_secrets
from traceml_otel.sanitize import one_line, redact_argv, strip_control
from traceml_otel.settings import Settings

RESTART_VARIABLE = "TORCHELASTIC_RESTART_COUNT"


def _endpoint(url: str, env: Mapping[str, str]) -> str:
    return Redactor(header_secrets(env))(redact_argv([url])[0])


def start_line(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The start line for a job with these settings (see the module docstring)."""
    env = os.environ if env is None else env
    run_dir = settings.run_dir
    folder = one_line(run_dir) if run_dir is not None else ""  # a newline in a path stays on this line
    parts = [f"traceml: run {one_line(settings.run_id)}"]
    parts.append(f"folder {folder}" if run_dir is not None else "no local copy (TRACEML_LOCAL_COPY=0)")
    traces, metrics = settings.traces, settings.metrics
    if traces is None and metrics is None:
        parts.append("OTLP off (no OTEL_EXPORTER_OTLP_ENDPOINT)")
    else:
        if traces is not None:
            parts.append(f"OTLP traces {_endpoint(traces.endpoint, env)} ({traces.protocol})")
        if metrics is not None and (traces is None or metrics.endpoint != traces.endpoint):
            parts.append(f"OTLP metrics {_endpoint(metrics.endpoint, env)} ({metrics.protocol})")
    if settings.prometheus_port:
        parts.append(f"Prometheus http://{settings.prometheus_addr}:{settings.prometheus_port}/metrics"
                     " (+ local rank)")
    if run_dir is not None:
        parts.append(f"watch: traceml top {folder}; mid-run diagnosis: traceml analyze {folder}")
    return strip_control(" | ".join(parts))


def print_start_line(settings: Settings, env: Mapping[str, str] | None = None) -> None:
    """Print it on stderr (never raises: a closed stderr loses only the line)."""
    try:
        print(start_line(settings, env), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def direct_launch_prints(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """True in the one process of a direct launch that prints the line: local rank 0, first attempt,
    not under ``traceml run`` (its launcher prints it)."""
    env = os.environ if env is None else env
    return (settings.launcher != "traceml run" and settings.identity.local_rank == 0
            and env.get(RESTART_VARIABLE, "0").strip() in ("", "0"))
