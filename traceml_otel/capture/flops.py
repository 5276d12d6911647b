"""Count one step's FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` (opt-in, one step only).

``trace_step(model, measure_flops=True)`` runs that one block under the counter: every forward,
backward and optimizer operation in it is counted, so a step of 4 accumulated micro-batches counts
all 4. The counter slows that step down; the MFU computation leaves it out of the timing.
"""

from __future__ import annotations

from typing import Any


class StepFlopCounter:
    """A ``FlopCounterMode`` opened at a step's start and read at its end (``None`` if torch lacks it)."""

    __slots__ = ("_mode",)

    def __init__(self) -> None:
        self._mode: Any = None

    def start(self) -> bool:
        """Open the counter; False when it cannot be used here (it then counts nothing)."""
        try:
            from torch.utils.flop_counter import FlopCounterMode
        except ImportError:
            return False
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()
        return True

    def stop(self) -> int | None:
        """Close the counter: the FLOPs counted, or ``None`` when it was not running."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        mode.__exit__(None, None, None)
        return int(mode.get_total_flops())


def device_name() -> str:
    """The CUDA device's name when CUDA is already initialised (never initialises it), else ``cpu``."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    return "cpu"
