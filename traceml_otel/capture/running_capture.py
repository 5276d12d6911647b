"""A deep capture in progress: the record the training thread fills and the exporter thread reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traceml_otel.wire.capture_record import CaptureRequest


@dataclass
class RunningCapture:
    """A capture in progress: its profiler and the steps it has seen."""

    index: int
    request: CaptureRequest
    profiler: Any
    steps_wanted: int
    activities: tuple[str, ...]
    steps: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    start_overhead_s: float = 0.0
    stop_overhead_s: float = 0.0
    started_unix: float = 0.0
    stopped_unix: float = 0.0
    train_s: float = 0.0
    """The rank's training time when the capture started (the cost budget's measure)."""
    deferred: bool = False
    """Its export waits until the cost budget covers it, or the end of training (the poller said so)."""
    run_cost_s: float = 0.0
    """Profiling's measured cost: start, stop and the captured steps over the rank's median."""
