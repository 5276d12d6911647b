"""The seam between step capture and CUDA: events, peak memory, nothing else.

``CpuClock`` measures nothing on a device. ``CudaEventClock`` records a CUDA event at
each mark and resolves them later with ``Event.query()`` and ``elapsed_time()``; it never
calls ``torch.cuda.synchronize()``. The recorder only talks to the small interface below,
so its resolution logic is unit-tested on CPU with a fake clock, and only a GPU run
proves this module (see ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import time
from typing import Any


class CpuClock:
    """No device: every device reading is absent (``None``), never zero."""

    has_device = False

    def mark(self) -> Any:
        """Record a device timestamp now. Runs on the training thread; must be cheap."""
        return None

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (at step start)."""

    def peak_memory(self) -> tuple[int, int, int] | None:
        """``(peak allocated, peak reserved, device total)`` in bytes since the last reset."""
        return None

    def is_done(self, mark: Any) -> bool:
        """Whether the device has passed ``mark`` (non-blocking)."""
        return True

    def elapsed_ns(self, start: Any, end: Any) -> int | None:
        """Device time between two completed marks, in nanoseconds."""
        return None

    def release(self, mark: Any) -> None:
        """Give a resolved mark back for reuse."""

    def wait(self, mark: Any, timeout_s: float) -> bool:
        """Poll until ``mark`` is done or the timeout passes (used only at shutdown)."""
        deadline = time.monotonic() + timeout_s
        while not self.is_done(mark):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True


class CudaEventClock(CpuClock):
    """CUDA events on the current stream, pooled; peak memory of the current device."""

    has_device = True

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._event_type = torch.cuda.Event
        self._free: list[Any] = []
        self._device = torch.cuda.current_device()
        self._total = int(torch.cuda.get_device_properties(self._device).total_memory)

    def mark(self) -> Any:
        event = self._free.pop() if self._free else self._event_type(enable_timing=True)
        event.record()
        return event

    def reset_peak_memory(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self._device)

    def peak_memory(self) -> tuple[int, int, int] | None:
        # One nested-dict read: max_memory_allocated() and max_memory_reserved() each flatten
        # the allocator's whole stats tree in Python, which cost ~100 us per step on an H200 host.
        stats = self._torch.cuda.memory_stats_as_nested_dict(self._device)
        try:
            allocated = stats["allocated_bytes"]["all"]["peak"]
            reserved = stats["reserved_bytes"]["all"]["peak"]
        except KeyError:  # allocator not initialised yet on this device
            return (0, 0, self._total)
        return (int(allocated), int(reserved), self._total)

    def is_done(self, mark: Any) -> bool:
        return mark is None or bool(mark.query())

    def elapsed_ns(self, start: Any, end: Any) -> int | None:
        if start is None or end is None:
            return None
        return int(start.elapsed_time(end) * 1_000_000)

    def release(self, mark: Any) -> None:
        if mark is not None:
            self._free.append(mark)


def default_clock() -> CpuClock:
    """CUDA events when CUDA is initialised-able here, else the CPU clock."""
    try:
        import torch

        if torch.cuda.is_available():
            return CudaEventClock()
    except Exception:
        pass
    return CpuClock()
