"""The step model's input records: what loaders rebuild from spans, and how a window is chosen.

Durations are seconds. ``None`` always means "not measured", never zero: a rule that needs a
missing value abstains instead of reading it as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from traceml_otel.analyze.kinds import Clock
from traceml_otel.contract import PHASES
from traceml_otel.errors import UsageError

PHASE_INDEX = {phase: index for index, phase in enumerate(PHASES)}
FORWARD, BACKWARD, OPTIMIZER, H2D = (PHASE_INDEX[p] for p in ("forward", "backward", "optimizer", "h2d"))

NO_PHASE_TIMES: tuple[float | None, ...] = (None,) * len(PHASES)
NO_PHASE_CALLS: tuple[int, ...] = (0,) * len(PHASES)
NO_PHASE_COMM: tuple[float, ...] = (0.0,) * len(PHASES)


class StepTiming(NamedTuple):
    """One rank's one training step, rebuilt from its ``traceml.step`` span and phase children.

    Phase tuples are indexed like :data:`traceml_otel.contract.PHASES`. A phase's time on a clock
    is the sum over its calls; it is ``None`` when the phase had no call or a call lacked that clock.

    A typed ``NamedTuple`` rather than a frozen dataclass (the other records' form): a run of a
    million spans builds about 200,000 of these, and a tuple is five times cheaper to build and
    to pass between reader processes.
    """

    run_id: str
    rank: int
    step: int
    trace_id: str = ""
    start_unix_nano: int = 0
    parallelism: str = "none"
    world_size: int | None = None
    traced_cpu: float | None = None
    traced_gpu: float | None = None
    input_wait_cpu: float | None = None
    input_wait_gpu: float | None = None
    h2d_before_cpu: float | None = None
    """Host-to-device copies made for this step before its block (a prepared loader's): the sum of the
    step fields that sum into ``h2d`` (``wire/step_schema.py``'s ``H2D_BEFORE_STEP``)."""
    phase_calls: tuple[int, ...] = NO_PHASE_CALLS
    phase_cpu: tuple[float | None, ...] = NO_PHASE_TIMES
    phase_gpu: tuple[float | None, ...] = NO_PHASE_TIMES
    optimizer_steps: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    memory_total: int | None = None
    error: str | None = None
    samples: int | None = None
    tokens: int | None = None
    comm_calls: int | None = None
    """Collective calls in the step; ``None`` when collective timing saw none (or was off)."""
    comm_bytes: int | None = None
    comm_cpu: float | None = None
    comm_gpu: float | None = None
    comm_exposed_cpu: float | None = None
    comm_exposed_gpu: float | None = None
    phase_comm_cpu: tuple[float, ...] = NO_PHASE_COMM
    """Exposed collective time inside each phase (summed over its calls; 0 where none was measured)."""
    phase_comm_gpu: tuple[float, ...] = NO_PHASE_COMM
    comm_entries: tuple[int, ...] | None = None
    """When the step began each wait it could have in collectives (Unix ns;
    ``traceml.communication.entries``)."""
    comm_work: tuple[int, ...] | None = None
    """ns worked before each entry since leaving the previous collective (``traceml.communication.work``)."""
    between_cpu: float | None = None
    """Time since this rank's previous step ended (``traceml.between_steps.cpu_duration``)."""
    source: str | None = None
    """How the step was found (``traceml.step.source``): ``trace_step``, ``inferred``, ..."""
    skipped_updates: int = 0
    """Updates a ``GradScaler.step`` skipped in the step (``traceml.optimizer.skipped``)."""
    weight: float = 1.0
    """How many steps this one stands for: ``1/p`` of a step the span budget exported with probability
    ``p`` (``traceml.sampling.threshold``, or the ``th`` of its ``tracestate``); 1 for every step read
    from an unsampled source."""

    @property
    def waited_cpu(self) -> float:
        """CPU time before the block that was the step's: its input wait and the loader-side copies
        (``h2d_before_cpu``), 0 where neither was measured."""
        return (self.input_wait_cpu or 0.0) + (self.h2d_before_cpu or 0.0)

    def traced(self, clock: Clock) -> float | None:
        """Time inside the ``trace_step()`` block on ``clock``."""
        return self.traced_gpu if clock is Clock.GPU else self.traced_cpu

    def input_wait(self, clock: Clock) -> float | None:
        """Time waiting on the data loader before this step, on ``clock``."""
        return self.input_wait_gpu if clock is Clock.GPU else self.input_wait_cpu

    def phase(self, index: int, clock: Clock) -> float | None:
        """Summed time of one phase on ``clock``; ``None`` if it had no call or lacks that clock."""
        return self.phase_gpu[index] if clock is Clock.GPU else self.phase_cpu[index]

    def communication(self, clock: Clock) -> float | None:
        """Exposed collective time on ``clock``: 0 with no collectives in the step, ``None`` if unmeasured."""
        if self.comm_calls is None:
            return 0.0
        return self.comm_exposed_gpu if clock is Clock.GPU else self.comm_exposed_cpu

    def phase_communication(self, index: int, clock: Clock) -> float:
        """Exposed collective time measured inside one phase on ``clock`` (0 when none)."""
        return self.phase_comm_gpu[index] if clock is Clock.GPU else self.phase_comm_cpu[index]

    def has_gpu_timing(self) -> bool:
        """True when the block, its input wait and every phase that ran carry GPU timings."""
        if self.traced_gpu is None or self.input_wait_gpu is None:
            return False
        return all(
            calls == 0 or gpu is not None for calls, gpu in zip(self.phase_calls, self.phase_gpu, strict=True)
        )


@dataclass(frozen=True, slots=True)
class RankHost:
    """What one rank recorded once about its input pipeline: the host's usable CPUs and the last
    DataLoader configuration it iterated (``None`` fields: not recorded)."""

    rank: int
    cpus: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    dataset: str | None = None

    @property
    def has_loader(self) -> bool:
        """True when a DataLoader's settings were recorded."""
        return self.num_workers is not None


@dataclass(frozen=True, slots=True)
class LoadedRun:
    """Every step of one run that a span source delivered, plus what the read noticed."""

    run_id: str
    steps: tuple[StepTiming, ...]
    source: str
    service: str = ""
    spans_read: int = 0
    foreign_spans: int = 0
    orphan_steps: int = 0
    other_run_ids: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    warnings_total: int = 0
    hosts: tuple[RankHost, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """Which aligned steps to analyse: the whole run, the last ``last`` steps, or a step range."""

    last: int | None = None
    first_step: int | None = None
    last_step: int | None = None

    def __post_init__(self) -> None:
        if self.last is not None and self.last < 1:
            raise UsageError("window size must be at least 1 step")
        if self.last is not None and (self.first_step is not None or self.last_step is not None):
            raise UsageError("choose either the last N steps or a step range, not both")

    @property
    def mode(self) -> str:
        """``run``, ``last`` or ``range``."""
        if self.last is not None:
            return "last"
        if self.first_step is not None or self.last_step is not None:
            return "range"
        return "run"
