"""Names of every span, attribute and metric traceml-otel emits.

This module is the code form of ``docs/telemetry.md``, the public contract. The
emitter writes these names and the analyzer reads them; the dashboard and the
alert rules use the Prometheus forms listed in the doc. Change both together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

INSTRUMENTATION_SCOPE = "traceml_otel"
CONTRACT_VERSION = 2

# --- span names -----------------------------------------------------------
SPAN_STEP = "traceml.step"
"""One per rank per training step: the ``trace_step()`` block. A root span."""

PHASES = ("forward", "backward", "optimizer", "h2d")
"""Phase names, in their usual order inside a step."""

PHASE_SPAN_NAMES = {phase: f"traceml.{phase}" for phase in PHASES}
SPAN_NAME_TO_PHASE = {name: phase for phase, name in PHASE_SPAN_NAMES.items()}

SPAN_COLLECTIVE = "traceml.collective"
SPAN_HANG = "traceml.hang"
"""One rank's hang, once per hang, in the trace of the step it hung in (see ``docs/hangs.md``)."""
ATTR_HANG_LOCATION = "traceml.hang.location"
ATTR_HANG_CODE = "traceml.hang.code"
ATTR_HANG_COLLECTIVE = "traceml.hang.collective"
ATTR_HANG_STALLED = "traceml.hang.stalled"
ATTR_HANG_STACKS = "traceml.hang.stacks"
ATTR_HANG_VERDICT = "traceml.hang.verdict"
"""The verdict over every rank that wrote a hang record (docs/hangs.md); the next four come with it."""
ATTR_HANG_CULPRIT = "traceml.hang.culprit"
ATTR_HANG_CULPRIT_RANKS = "traceml.hang.culprit_ranks"
ATTR_HANG_CULPRIT_LOCATION = "traceml.hang.culprit_location"
ATTR_HANG_WAITING_RANKS = "traceml.hang.waiting_ranks"
SPAN_CAPTURE = "traceml.capture"
"""One rank's deep capture, once per capture, in the trace of its first step (see ``docs/captures.md``)."""
ATTR_CAPTURE_INDEX = "traceml.capture.index"
ATTR_CAPTURE_REASON = "traceml.capture.reason"
ATTR_CAPTURE_DETAIL = "traceml.capture.detail"
ATTR_CAPTURE_STEPS = "traceml.capture.steps"
ATTR_CAPTURE_TRACE_FILE = "traceml.capture.trace_file"
ATTR_CAPTURE_TOP_OPERATOR = "traceml.capture.top_operator"
"""Collectives of one step, one span per (source, kind): a bounded number per step, never one per call."""

# --- attributes on every traceml span ---------------------------------------
ATTR_RUN_ID = "traceml.run.id"
ATTR_JOB = "traceml.job"
"""The job across restarts: every attempt (run id) of one job carries the same value (on every metric
point and the resource; docs/telemetry.md, "Job identity")."""
ATTR_STEP = "traceml.step.number"
ATTR_RANK = "traceml.rank"

# --- attributes on the step span ----------------------------------------------
ATTR_LOCAL_RANK = "traceml.local_rank"
ATTR_WORLD_SIZE = "traceml.world_size"
ATTR_NODE_RANK = "traceml.node_rank"
ATTR_HOST = "traceml.host"
ATTR_PARALLELISM = "traceml.parallelism"
"""How this rank relates to the others: ``ddp`` or ``fsdp`` (ranks that synchronize gradients),
``independent`` (several processes that do not) or ``none`` (see docs/telemetry.md)."""
PARALLELISM_VALUES = ("none", "ddp", "fsdp", "independent")
ATTR_CLOCK = "traceml.clock"
"""``gpu`` when CUDA events timed the step, else ``cpu``."""
ATTR_STEP_CPU_DURATION = "traceml.step.cpu_duration"
ATTR_STEP_GPU_DURATION = "traceml.step.gpu_duration"
ATTR_INPUT_WAIT_CPU = "traceml.input_wait.cpu_duration"
ATTR_INPUT_WAIT_GPU = "traceml.input_wait.gpu_duration"
ATTR_INPUT_WAIT_FETCHES = "traceml.input_wait.fetches"
ATTR_OPTIMIZER_SKIPPED = "traceml.optimizer.skipped"
"""Updates a ``GradScaler.step`` skipped in the step (present when there was one)."""
ATTR_INPUT_WAIT_IN_STEP_CPU = "traceml.input_wait.in_step.cpu_duration"
"""The part of the input wait spent in fetches inside the block (left out of the step's CPU duration)."""
ATTR_PREFETCH_H2D_CPU = "traceml.h2d.prefetch.cpu_duration"
"""Host-to-device copies the data loader made between steps (Accelerate's prepared
loaders); part of neither the input wait nor the traced block."""
ATTR_OPTIMIZER_STEPS = "traceml.optimizer.steps"
ATTR_MEM_PEAK_ALLOCATED = "traceml.cuda.memory.peak_allocated"
ATTR_MEM_PEAK_RESERVED = "traceml.cuda.memory.peak_reserved"
ATTR_MEM_TOTAL = "traceml.cuda.memory.total"
ATTR_EXCEPTION_TYPE = "exception.type"
ATTR_STEP_SAMPLES = "traceml.step.samples"
"""Samples in the step on this rank: declared with ``trace_step(samples=)``, else the batch
dimension of what the DataLoader returned for it. Absent when unknown."""
ATTR_STEP_TOKENS = "traceml.step.tokens"
"""Tokens in the step on this rank; only when declared with ``trace_step(tokens=)``."""
ATTR_STEP_SOURCE = "traceml.step.source"
"""How the step was found: ``trace_step`` (a ``trace_step`` block), ``hf_trainer`` / ``lightning`` (the
framework callbacks) or ``inferred`` (a plain loop under zero-code tracing; see
docs/integrations/inferred-steps.md)."""
STEP_SOURCES = ("trace_step", "hf_trainer", "lightning", "inferred")
ATTR_BETWEEN_STEPS_CPU = "traceml.between_steps.cpu_duration"
"""Seconds from the end of this rank's previous step to this step's start (input wait included,
``outside_step`` blocks such as evaluation excluded). Absent on a rank's first step."""
ATTR_SAMPLING_THRESHOLD = "traceml.sampling.threshold"
"""On the step span of a step exported under the span budget (``TRACEML_OTLP_SPANS``): the OpenTelemetry
consistent-sampling threshold ``th`` (hex) its trace was kept with, as in its ``tracestate``
``ot=th:...``; ``0`` for a step kept with certainty. The step counts for ``2**56 / (2**56 - th)`` steps."""
ATTR_LOADER_NUM_WORKERS = "traceml.dataloader.num_workers"
ATTR_LOADER_PIN_MEMORY = "traceml.dataloader.pin_memory"
ATTR_LOADER_PERSISTENT_WORKERS = "traceml.dataloader.persistent_workers"
ATTR_LOADER_PREFETCH_FACTOR = "traceml.dataloader.prefetch_factor"
ATTR_LOADER_BATCH_SIZE = "traceml.dataloader.batch_size"
ATTR_LOADER_DATASET = "traceml.dataloader.dataset"
"""DataLoader settings: on the step after a loader with a new configuration was first iterated."""
ATTR_HOST_CPUS = "traceml.host.cpus"
"""CPUs this rank's process may run on: on the first step each rank emits."""
ATTR_COMM_CALLS = "traceml.communication.calls"
"""Collective calls in the step; present only when collective timing saw at least one."""
ATTR_COMM_BYTES = "traceml.communication.bytes"
ATTR_COMM_CPU = "traceml.communication.cpu_duration"
"""Total time in collectives (sum over calls, overlapping compute or not)."""
ATTR_COMM_GPU = "traceml.communication.gpu_duration"
ATTR_COMM_EXPOSED_CPU = "traceml.communication.exposed.cpu_duration"
"""The part of the collectives' time the step waited for; absent when it could not be measured."""
ATTR_COMM_EXPOSED_GPU = "traceml.communication.exposed.gpu_duration"
ATTR_COMM_ENTRIES = "traceml.communication.entries"
"""Int array: when this rank began each wait its step could have in collectives (Unix ns, the spans'
clock): a blocking call's start, DDP's last gradient bucket hand-over of each backward call. In call
order, at most ``MAX_COMM_ENTRIES``; absent beyond that or when none could be timed. The analyzer
lines up every rank's entries of one step to split waiting for the last rank from the transfer."""
ATTR_COMM_WORK = "traceml.communication.work"
"""Int array beside ``traceml.communication.entries``: ns the rank worked before each entry, since it
left its previous collective (of this step or an earlier one; before the first collective of a
run: since it asked the loader for the step's batch)."""
MAX_COMM_ENTRIES = 64

# --- attributes of the per-rank info metric (traceml.rank.info) -------------------
ATTR_CUDA_DEVICE = "traceml.cuda.device"
"""CUDA device index the rank uses ("" until CUDA is initialised, and on CPU)."""
ATTR_GPU_UUID = "traceml.gpu.uuid"
"""The device's UUID in NVIDIA's form ``GPU-<uuid>`` (DCGM exporter's ``UUID`` label)."""
ATTR_VERSION = "traceml.version"

# --- attributes on phase spans --------------------------------------------------
ATTR_PHASE_NAME = "traceml.phase.name"
ATTR_PHASE_CALL = "traceml.phase.call"
ATTR_PHASE_CPU_DURATION = "traceml.phase.cpu_duration"
ATTR_PHASE_GPU_DURATION = "traceml.phase.gpu_duration"
ATTR_H2D_BYTES = "traceml.h2d.bytes"
ATTR_MODULE_CLASS = "traceml.module.class"
"""On a forward span of a step that ran more than one model: the class of the model it timed."""
ATTR_PHASE_COMM_EXPOSED_CPU = "traceml.phase.communication.exposed.cpu_duration"
"""Exposed collective time that lies inside this phase call (present when the call had collectives)."""
ATTR_PHASE_COMM_EXPOSED_GPU = "traceml.phase.communication.exposed.gpu_duration"

# --- attributes on collective spans ------------------------------------------------
ATTR_COLLECTIVE_KIND = "traceml.collective.kind"
"""``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``reduce``, ``barrier``,
``all_to_all``, ``gather``, ``scatter``, or ``custom`` (a DDP hook the program registered)."""
ATTR_COLLECTIVE_SOURCE = "traceml.collective.source"
"""``ddp`` (gradient buckets) or ``api`` (a ``torch.distributed`` call inside the step)."""
ATTR_COLLECTIVE_CALLS = "traceml.collective.calls"
ATTR_COLLECTIVE_BYTES = "traceml.collective.bytes"
ATTR_COLLECTIVE_CPU = "traceml.collective.cpu_duration"
ATTR_COLLECTIVE_GPU = "traceml.collective.gpu_duration"
ATTR_COLLECTIVE_EXPOSED_CPU = "traceml.collective.exposed.cpu_duration"
ATTR_COLLECTIVE_EXPOSED_GPU = "traceml.collective.exposed.gpu_duration"

# --- metric names (OTel form; Prometheus form in docs/telemetry.md) -------------
METRIC_STEP_DURATION = "traceml.step.duration"
METRIC_PHASE_DURATION = "traceml.phase.duration"
METRIC_INPUT_WAIT = "traceml.input_wait.duration"
METRIC_MEM_PEAK_ALLOCATED = "traceml.cuda.memory.peak_allocated"
METRIC_MEM_PEAK_RESERVED = "traceml.cuda.memory.peak_reserved"
METRIC_STEPS = "traceml.steps"
METRIC_SPANS_DROPPED = "traceml.export.dropped_spans"
METRIC_STEP_INPUT_WAIT = "traceml.step.input_wait"
"""Histogram of each measured step's input wait: exact mean over any window."""
METRIC_LAST_STEP_TIMESTAMP = "traceml.step.last_timestamp"
"""Unix time at which the last step ended (run liveness)."""
METRIC_RUN_ENDED = "traceml.run.ended"
"""0 while the rank runs, 1 once it ended cleanly (the clean-end marker)."""
METRIC_PROGRESS_STALLED = "traceml.progress.stalled"
"""Seconds this rank has made no progress, once its hang watchdog saw a hang (0 otherwise); its
``traceml.phase.name`` attribute says where it is: ``collective`` (waiting for others) or another phase."""
METRIC_RUN_EXIT = "traceml.run.exit"
"""Always 1, present once the rank ended and said how: ``traceml.exit.status`` and ``traceml.exit.reason``."""
ATTR_EXIT_STATUS = "traceml.exit.status"
EXIT_STATUSES = ("clean", "exception", "signal")
"""``clean`` (the script returned), ``exception`` (an uncaught exception: the reason is its type),
``signal`` (SIGTERM or SIGINT: the reason names it). A rank killed outright (SIGKILL) says nothing."""
ATTR_EXIT_REASON = "traceml.exit.reason"
METRIC_RUN_FIRST_FAILURE = "traceml.run.first_failure"
"""Always 1, present after the rank's end once ``traceml run`` saw a rank fail first (a rank killed by
the OS, whose peers' errors are consequences): ``traceml.first_failure.rank`` and ``.reason`` name it."""
ATTR_FIRST_FAILURE_RANK = "traceml.first_failure.rank"
ATTR_FIRST_FAILURE_REASON = "traceml.first_failure.reason"
METRIC_WORLD_SIZE = "traceml.world_size"
"""Ranks in the job, as this rank was told (``WORLD_SIZE``): the stack compares the live ranks with it."""
METRIC_RANK_INFO = "traceml.rank.info"
"""Always 1; its attributes (host, local rank, CUDA device, GPU UUID, version) join exporters."""
METRIC_SAMPLES = "traceml.samples"
"""Counter of samples processed (steps with a known sample count); ``rate()`` is the throughput."""
METRIC_TOKENS = "traceml.tokens"
"""Counter of tokens processed (steps that declared tokens)."""
METRIC_COLLECTIVE_DURATION = "traceml.collective.duration"
"""Histogram: per step and (source, kind), total collective time on the step's clock."""
METRIC_COLLECTIVE_EXPOSED = "traceml.collective.exposed"
"""Histogram: per step and (source, kind), the exposed part, when it was measured."""
METRIC_COLLECTIVE_CALLS = "traceml.collective.calls"
"""Counter: collective calls per (source, kind); with the next, bytes per call tell the latency regime
(many small calls) from the bandwidth regime (large ones)."""
METRIC_COLLECTIVE_BYTES = "traceml.collective.bytes"
"""Counter: the calls' payload bytes per (source, kind) (0 for ``barrier`` and the ``*_object`` calls)."""

METRIC_TIME = "traceml.time"
"""Counter: seconds of this rank's wall time by ``traceml.time.category`` (docs/goodput.md)."""
ATTR_TIME_CATEGORY = "traceml.time.category"
METRIC_MODEL_FLOPS = "traceml.model_flops"
"""Counter: model FLOPs of the completed steps whose FLOPs were declared or measured (MFU's numerator)."""
METRIC_PEAK_FLOPS = "traceml.peak_flops"
"""Gauge: this rank's peak FLOP/s (``TRACEML_PEAK_FLOPS`` or the table), only when known."""
TIME_STARTUP = "startup"
TIME_STEP_INPUT_WAIT = "step.input_wait"
TIME_STEP_BLOCK = "step.block"
"""The traced step blocks: goodput's numerator (the analyzer splits it into phases)."""
TIME_BETWEEN_STEPS = "between_steps"
TIME_STALLED = "stalled"
TIME_REDONE_STEPS = "redone_steps"
TIME_SHUTDOWN = "shutdown"
TIME_OUTSIDE_PREFIX = "outside."
"""``outside.<kind>``: ``outside_step`` time per kind."""

DURATION_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Explicit histogram boundaries in seconds, for the step duration (the histogram quantiles and
exemplars read them)."""
SUM_ONLY_HISTOGRAMS = (METRIC_PHASE_DURATION, METRIC_STEP_INPUT_WAIT, METRIC_COLLECTIVE_DURATION,
                       METRIC_COLLECTIVE_EXPOSED)
"""Histograms exported with no boundary (one ``+Inf`` bucket, ``_sum`` and ``_count``): rules and panels
read only their sum and count, and 17 buckets per series would be most of a rank's series."""

# --- local copy layout -------------------------------------------------------------
RUNS_DIR_DEFAULT = "traceml-runs"
MANIFEST_FILE = "manifest.json"


def traces_file_name(rank: int) -> str:
    """Name of one rank's OTLP JSON Lines file inside the run directory."""
    return f"rank-{rank}.traces.jsonl"


def export_stats_file_name(rank: int) -> str:
    """Name of one rank's export statistics file inside the run directory."""
    return f"rank-{rank}.export.json"


def hang_file_name(rank: int) -> str:
    """Name of one rank's hang record (``rank-R.hang.json``, see ``docs/hangs.md``)."""
    return f"rank-{rank}.hang.json"


def time_file_name(rank: int) -> str:
    """Name of one rank's time record (``rank-R.time.json``: process start and end, ``outside_step``
    totals by kind, FLOPs; see ``docs/goodput.md``)."""
    return f"rank-{rank}.time.json"


def hang_traceback_file_name(rank: int) -> str:
    """Name of one rank's faulthandler stack dump, written when its hang watchdog could not run."""
    return f"rank-{rank}.hang-traceback.txt"


def outside_marker_file_name(rank: int) -> str:
    """Name of the marker a rank keeps while in a long ``outside_step`` block (see ``docs/hangs.md``)."""
    return f"rank-{rank}.outside.json"


def flight_recorder_file_name(rank: int) -> str:
    """Name of one rank's PyTorch flight recorder dump (JSON), written on a hang when it is enabled."""
    return f"rank-{rank}.flight-recorder.json"


def handoff_file_name(rank: int) -> str:
    """Name of the trainer's record of what it handed a rank's emitter that did not report back."""
    return f"rank-{rank}.handoff.json"


def rank_of_file(name: str, file_name: Callable[[int], str]) -> int | None:
    """The rank ``name`` belongs to when it is ``file_name(rank)`` for some rank (e.g. with
    :func:`export_stats_file_name`), else ``None``."""
    prefix, _, suffix = file_name(0).partition("0")
    fits = name.startswith(prefix) and name.endswith(suffix)
    middle = name[len(prefix):len(name) - len(suffix)] if fits else ""
    if not middle.isascii() or not middle.isdigit() or len(middle) > 9:
        return None
    rank = int(middle)
    return rank if file_name(rank) == name else None


def step_trace_id(run_id: str, step: int) -> int:
    """The 128-bit trace id shared by every rank's spans of one step.

    Derived from (run id, step) alone, so ranks agree without a collective and a
    ratio sampler (which reads the low 64 bits) decides the same on every rank: the first 16 bytes
    of ``sha256(run_id + "\0" + str(step))``, 1 where they are all zero. Computed here for one step
    (the span builder's, per step: reading :func:`step_trace_ids_hex`'s text back cost 0.4 us more);
    the hash input is :func:`_trace_prefix`'s for both.
    """
    digest = hashlib.sha256(_trace_prefix(run_id) + b"%d" % step).digest()
    return int.from_bytes(digest[:16], "big") or 1


_ZERO_TRACE_HEX, _ONE_TRACE_HEX = "0" * 32, "0" * 31 + "1"


def _trace_prefix(run_id: str) -> bytes:
    """The trace id hash's input before the step number."""
    return f"{run_id}\x00".encode()


def step_trace_ids_hex(run_id: str, steps: list[int]) -> list[str]:
    """Each step's :func:`step_trace_id` as 32 hex digits (``"%032x"``), for many steps of one run:
    the same hash's own hex digest, without the integer in between."""
    prefix, sha256 = _trace_prefix(run_id), hashlib.sha256
    texts = [sha256(prefix + b"%d" % step).hexdigest()[:32] for step in steps]
    if _ZERO_TRACE_HEX in texts:  # one in 2**128: the id is 1, as step_trace_id says
        texts = [_ONE_TRACE_HEX if text == _ZERO_TRACE_HEX else text for text in texts]
    return texts
