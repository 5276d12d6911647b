"""traceml-otel: PyTorch step telemetry as OpenTelemetry spans and metrics.

    import traceml_otel as traceml

    traceml.init(mode="auto")
    for x, y in loader:
        with traceml.trace_step(model):
            ...  # zero_grad, forward, backward, optimizer.step

Spans and metrics leave over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and a
local OTLP-JSON copy lands in ``traceml-runs/<run-id>/`` for ``traceml analyze``.
"""

from traceml_otel._api import (
    flush,
    init,
    shutdown,
    trace_step,
    wrap_backward,
    wrap_dataloader_fetch,
    wrap_forward,
    wrap_h2d,
    wrap_optimizer,
)
from traceml_otel._version import __version__

__all__ = [
    "__version__",
    "flush",
    "init",
    "shutdown",
    "trace_step",
    "wrap_backward",
    "wrap_dataloader_fetch",
    "wrap_forward",
    "wrap_h2d",
    "wrap_optimizer",
]
