"""Stable names of diagnosis kinds and severities (the values reports and ``compare`` key on)."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A string enum whose ``str()`` and ``format()`` are its value (``enum.StrEnum`` is 3.11+)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Severity(StrEnum):
    """How urgent a finding is; ordered by :data:`SEVERITY_ORDER`."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITY_ORDER = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class StepKind(StrEnum):
    """Step-time diagnosis kinds. Only these decide the run's primary verdict."""

    INPUT_BOUND = "INPUT_BOUND"
    H2D_BOUND = "H2D_BOUND"
    RESIDUAL_HEAVY = "RESIDUAL_HEAVY"
    COMPUTE_BOUND = "COMPUTE_BOUND"
    COMMUNICATION_BOUND = "COMMUNICATION_BOUND"
    STRAGGLER = "STRAGGLER"
    INPUT_STRAGGLER = "INPUT_STRAGGLER"
    H2D_STRAGGLER = "H2D_STRAGGLER"
    COMPUTE_STRAGGLER = "COMPUTE_STRAGGLER"
    INDEPENDENT_RANKS = "INDEPENDENT_RANKS"
    BETWEEN_STEPS = "BETWEEN_STEPS"
    """Loops whose fetches are not measured: the time between steps (analyze/between_steps.py)."""
    BALANCED = "BALANCED"
    INCOMPLETE_DATA = "INCOMPLETE_DATA"
    WARMUP = "WARMUP"
    NO_DATA = "NO_DATA"


HEALTHY_KINDS = frozenset({StepKind.BALANCED, StepKind.COMPUTE_BOUND})
"""Kinds that say nothing is wrong with the step time."""
INCONCLUSIVE_KINDS = frozenset({StepKind.INCOMPLETE_DATA, StepKind.WARMUP, StepKind.NO_DATA})
"""Kinds that say the data could not decide."""


class MemoryKind(StrEnum):
    """Step-memory kinds; reported in their own section, never the primary verdict."""

    NO_GPU = "NO_GPU"
    NOT_ENOUGH_STEPS = "NOT_ENOUGH_STEPS"
    HIGH_PRESSURE = "HIGH_PRESSURE"
    IMBALANCE = "IMBALANCE"
    MEMORY_CREEP = "MEMORY_CREEP"
    MEMORY_RISING = "MEMORY_RISING"
    STABLE = "STABLE"


class DriftKind(StrEnum):
    """How the step time moved between the start of the run and its recent steps."""

    STABLE = "STABLE"
    SLOWING = "SLOWING"
    SPEEDING_UP = "SPEEDING_UP"
    NOT_ENOUGH_STEPS = "NOT_ENOUGH_STEPS"


class Clock(StrEnum):
    """The clock one analysis window is measured on. Never mixed inside a window."""

    CPU = "cpu"
    GPU = "gpu"


class RunKind(StrEnum):
    """Findings about the run's data itself (shown above the verdict, never the primary verdict)."""

    MISSING_RANKS = "MISSING_RANKS"
    PARTIAL_RANKS = "PARTIAL_RANKS"
    RUN_FAILED = "RUN_FAILED"
    RUN_INTERRUPTED = "RUN_INTERRUPTED"
    HANG = "HANG"
    STALL = "STALL"
    """A rank made no progress for far longer than its typical step, then went on (``stalls.py``)."""
    TELEMETRY_DEGRADED = "TELEMETRY_DEGRADED"
