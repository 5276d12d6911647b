"""A rank's deep captures put together at ``init()`` and taken apart at shutdown: the exporter, the
capture and its poller (``capture/profiler_capture.py``, ``capture_export.py``, ``capture_poller.py``),
which know nothing of one another's construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from traceml_otel.capture.profiler_capture import CaptureHost, ProfilerCapture
from traceml_otel.capture.running_capture import RunningCapture


def start_profiler_capture(session: CaptureHost, settings: Any, warn: Callable[[str], None]) -> Any:
    """This rank's deep captures and their poller, or ``None`` (off, no run folder, no torch)."""
    from traceml_otel.settings import capture_settings

    try:
        options = capture_settings()
    except Exception as error:
        warn(f"deep captures are off for this run: {error}")
        return None
    if not options.enabled or settings.run_dir is None:
        return None
    try:
        import torch.profiler  # noqa: F401
    except Exception:
        return None
    from traceml_otel.capture.capture_export import CaptureExporter
    from traceml_otel.capture.capture_poller import CapturePoller
    from traceml_otel.capture.time_ledger import restart_count

    restart = restart_count()
    crashed = earlier_crash(settings.run_dir, restart) if options.auto else None
    if crashed is not None:
        options = replace(options, auto=False)
        warn(f"an earlier attempt of this run ended with a capture {crashed}: automatic captures are off "
             "for this attempt (`traceml capture` still works)")
    try:
        exporter = CaptureExporter(settings.run_dir, settings.run_id, settings.identity.rank, options, warn)
        capture = ProfilerCapture(session, options, exporter, warn)
        poller = CapturePoller(capture, settings.run_dir, settings.identity.rank, options, warn, restart)
        poller.start()
    except Exception as error:  # never a reason not to train
        warn(f"deep captures are off for this run: {type(error).__name__}: {error}")
        return None
    capture.poller = poller  # type: ignore[attr-defined]
    return capture


def close_profiler_capture(capture: ProfilerCapture | None, wait_s: float = 10.0) -> None:
    """At shutdown: stop the poller, end a running capture, let the exporter finish (bounded)."""
    if capture is None:
        return
    poller = getattr(capture, "poller", None)
    if poller is not None:
        poller.stop()
    pending, capture.pending = capture.pending, None
    if pending is not None:  # taken, but the training ended before the step it was armed for
        last = capture.session.recorder.step - 1
        at = pending.at_step if pending.at_step is not None else last + 1
        capture.exporter.unwritten.append((
            RunningCapture(index=capture.started + 1, request=pending, profiler=None, steps_wanted=0,
                           activities=()),
            f"not started: armed for step {at}, and the training ended at step {last} before it"))
    if capture.running is not None:
        capture.stop()
    if poller is not None:
        poller.clear_in_flight()  # a clean end: no capture is left in flight
    capture.exporter.close(wait_s)


def earlier_crash(run_dir: Path, restart: int) -> str | None:
    """How an earlier attempt's capture was left in flight (``"armed or running on rank R (...)"``) when
    the run folder holds such a marker from an attempt before ``restart``, else ``None``."""
    from traceml_otel.wire.capture_in_flight import read_in_flight

    if restart <= 0:
        return None
    earlier = [m for m in read_in_flight(run_dir) if m.restart < restart]
    if not earlier:
        return None
    first = earlier[0]
    stack = ", stacks on" if first.with_stack else ""
    more = f" and {len(earlier) - 1} more rank(s)" if len(earlier) > 1 else ""
    return f"armed or running on rank {first.rank}{more} ({first.reason}{stack})"
