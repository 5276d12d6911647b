"""Typed records handed from capture to the emitter.

Times are epoch nanoseconds on the CPU clock; GPU figures are nanoseconds measured by
CUDA events (offsets from the step's start event, and durations). ``None`` always
means "not measured", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PhaseTiming:
    """One call of one phase (forward, backward, optimizer, h2d) inside a step."""

    phase: str
    call: int
    start_ns: int
    end_ns: int
    gpu_offset_ns: int | None = None
    gpu_duration_ns: int | None = None
    nbytes: int | None = None


@dataclass(frozen=True, slots=True)
class CollectiveTiming:
    """One collective call (a DDP gradient bucket, a ``torch.distributed`` call) inside a step.

    ``end_ns`` is ``None`` when the call had not completed when the step was handed off. ``blocking``
    is True when the calling thread waited for the whole call (a synchronous ``torch.distributed``
    call), so all of it is exposed; DDP buckets overlap backward, and their exposed part is worked out
    per backward call by the emitter.
    """

    kind: str
    source: str
    start_ns: int
    end_ns: int | None
    nbytes: int
    blocking: bool
    gpu_offset_ns: int | None = None
    gpu_duration_ns: int | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One completed ``trace_step()`` block on one rank."""

    step: int
    start_ns: int
    end_ns: int
    phases: tuple[PhaseTiming, ...] = ()
    gpu_duration_ns: int | None = None
    input_wait_ns: int | None = None
    input_wait_gpu_ns: int | None = None
    input_fetches: int = 0
    prefetch_h2d_ns: int | None = None
    optimizer_steps: int = 0
    parallelism: str = "none"
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_total_bytes: int | None = None
    exception_type: str | None = None
    collectives: tuple[CollectiveTiming, ...] = ()

    @property
    def clock(self) -> str:
        """``gpu`` when CUDA events timed this step, else ``cpu``."""
        return "cpu" if self.gpu_duration_ns is None else "gpu"
