"""Typed records handed from capture to the emitter.

Times are epoch nanoseconds on the CPU clock; GPU figures are nanoseconds measured by
CUDA events (offsets from the step's start event, and durations). ``None`` always
means "not measured", never zero.

The records are treated as immutable but not declared ``frozen``: the emitter builds several per
step, and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` call per field) cost it about
4 us per step more. ``unsafe_hash`` keeps them hashable, as frozen records were.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, unsafe_hash=True)
class PhaseTiming:
    """One call of one phase (forward, backward, optimizer, h2d) inside a step."""

    phase: str
    call: int
    start_ns: int
    end_ns: int
    gpu_offset_ns: int | None = None
    gpu_duration_ns: int | None = None
    nbytes: int | None = None
    module: str | None = None
    """A forward's model class, when the step ran more than one model (``traceml.module.class``)."""


@dataclass(slots=True, unsafe_hash=True)
class LoaderSettings:
    """A DataLoader's configuration, recorded once per configuration seen (not per step).

    ``pin_memory`` is the effective value (torch turns it off without an accelerator);
    ``prefetch_factor`` is ``None`` without worker processes; ``batch_size`` is ``None`` when the
    loader does not batch (``batch_size=None``) or batches through a custom sampler without one.
    """

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batch_size: int | None
    dataset: str | None = None
    """The dataset's class name (``TensorDataset``, ``ImageFolder``, ...); ``None`` from older trainers."""


@dataclass(slots=True, unsafe_hash=True)
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


@dataclass(slots=True, unsafe_hash=True)
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
    samples: int | None = None
    """Samples in this step: given to ``trace_step(samples=)``, else the batch dimension of the batches
    fetched for it (the last fetch before the step plus any inside it)."""
    tokens: int | None = None
    """Tokens in this step, only when given to ``trace_step(tokens=)``."""
    loader: LoaderSettings | None = None
    """Set on the step after a DataLoader with a new configuration was first iterated."""
    collectives: tuple[CollectiveTiming, ...] = ()
    source: str | None = None
    """How the step was found: ``trace_step``, ``hf_trainer``, ``lightning`` or ``inferred``."""
    between_steps_ns: int | None = None
    """Time from the end of this rank's previous step to this step's start (less ``outside_step``
    blocks); None on a rank's first step."""
    input_wait_in_step_ns: int | None = None
    """The part of ``input_wait_ns`` spent in fetches inside the block (gradient accumulation's later
    micro-batches): inside ``start_ns``..``end_ns`` too, so the traced time leaves it out."""

    skipped_updates: int = 0
    """``GradScaler.step`` calls in the step that skipped their update (inf/NaN gradients)."""

    @property
    def traced_cpu_ns(self) -> int:
        """The block's CPU time less the fetches inside it (those are input wait)."""
        return self.end_ns - self.start_ns - (self.input_wait_in_step_ns or 0)

    @property
    def waited_ns(self) -> int:
        """Time before the block that was the step's: its input wait and the loader-side copies
        (``prefetch_h2d_ns``), 0 where neither was measured."""
        return (self.input_wait_ns or 0) + (self.prefetch_h2d_ns or 0)

    @property
    def clock(self) -> str:
        """``gpu`` when CUDA events timed this step, else ``cpu``."""
        return "cpu" if self.gpu_duration_ns is None else "gpu"
