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

from traceml_otel._version import __version__


def _first_seen() -> tuple[float, float | None, bool]:
    """The wall time now, how long this process has run or waited for a CPU since it began
    (``/proc/self/schedstat``) and whether it has waited for a child yet (a shell that ran ``sleep``
    before exec'ing this program; ``/proc/self/stat``): the earliest this interpreter can vouch for
    its own start (``capture/time_ledger.py:own_start_time``). Small reads, once per process."""
    import time

    try:
        with open("/proc/self/schedstat", "rb") as stat:
            run_ns, wait_ns = stat.read().split()[:2]
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        waited = int(fields[8]) + int(fields[13]) + int(fields[14]) > 0  # cminflt, cutime, cstime
        return time.time(), (int(run_ns) + int(wait_ns)) / 1e9, waited
    except (OSError, ValueError, IndexError):
        return time.time(), None, False


_FIRST_SEEN = _first_seen()
"""(wall time, seconds running or runnable, waited for a child) when this package was first imported."""

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
