"""traceml-otel: PyTorch step telemetry as OpenTelemetry spans and metrics.

    import traceml_otel as traceml

    traceml.init(mode="auto")
    for x, y in loader:
        with traceml.trace_step(model):
            ...  # zero_grad, forward, backward, optimizer.step

Spans and metrics leave over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and a
local OTLP-JSON copy lands in ``traceml-runs/<run-id>/`` for ``traceml analyze``. The training
API loads on first use (``__getattr__``), so the analyzer imports none of it.
"""

from traceml_otel import _first_seen  # noqa: F401 - first: the earliest moment this process can vouch for
from traceml_otel._version import __version__

TYPE_CHECKING = False  # not typing's: start-up hooks import this package in every process (typing costs ms)

if TYPE_CHECKING:
    from traceml_otel._api import (
        declare_flops,
        flush,
        init,
        outside_step,
        resume_from,
        shutdown,
        trace_step,
        wrap_backward,
        wrap_dataloader_fetch,
        wrap_forward,
        wrap_h2d,
        wrap_optimizer,
    )

__all__ = [
    "__version__",
    "declare_flops",
    "flush",
    "init",
    "outside_step",
    "resume_from",
    "shutdown",
    "trace_step",
    "wrap_backward",
    "wrap_dataloader_fetch",
    "wrap_forward",
    "wrap_h2d",
    "wrap_optimizer",
]


def __getattr__(name: str) -> object:
    """Load the training API on first use, so ``import traceml_otel.analyze`` (the analysis-only
    install) loads no capture or export code. The name is then a plain module attribute, so
    ``traceml.trace_step`` costs the same as an eager import on every later step."""
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'traceml_otel' has no attribute {name!r}")
    from traceml_otel import _api

    value = getattr(_api, name)
    globals()[name] = value
    return value
