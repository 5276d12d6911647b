"""Every environment variable traceml-otel reads, parsed once into frozen settings.

Components take a :class:`Settings` (or the :class:`RankIdentity` in it), or call one of the readers
here for the few variables read outside a rank's settings (the launcher's shutdown wait, the
diagnosis budget, the launcher pid, the zero-code markers), and never read ``TRACEML_*`` from
``os.environ`` themselves: one parser, so the launcher and the ranks cannot disagree on a value.
The one exception is the start-up filter (``integrations/startup.py``, run by ``traceml run``'s
``sitecustomize`` and by the ``.pth`` file of ``TRACEML_AUTO=1``), which runs in every Python process
they reach and must not import the rest of traceml_otel before it knows it attaches; it reads
``TRACEML_AUTO``, ``TRACEML_AUTO_ATTACH`` and ``TRACEML_BOOT_SCRIPT`` as :func:`auto_requested`,
:func:`auto_attach_requested` and :func:`boot_script` do. The ``OTEL_*`` exporter variables (headers, timeout,
compression, certificates, insecure) are read by the OTel SDK's exporters inside the
emitter process; we only read the ones that decide *whether* and *how* to export.

What the values decide lives beside this module: :mod:`traceml_otel.run_identity` names the run and
its job from what the launchers set, :mod:`traceml_otel.otlp_choice` picks each signal's OTLP
endpoint and protocol. Both read no ``TRACEML_*`` variable: this module passes the values in.

Durations (the ``*_S`` variables) and ``TRACEML_HANG_FACTOR`` take decimals (``2.5``); counts,
ports and milliseconds take whole numbers. Every on/off ``TRACEML_*`` variable goes through one parser
(:func:`~traceml_otel.env_values.flag`): ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``,
and any other value is refused with a :class:`SettingsError` (``init()`` says so on one line and runs
without telemetry; ``traceml run`` exits 2).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from traceml_otel.contract import RUNS_DIR_DEFAULT
from traceml_otel.env_values import decimal, flag, otel_true, whole_number
from traceml_otel.errors import SettingsError
from traceml_otel.otlp_choice import SignalExport, signal_export
from traceml_otel.run_identity import (
    RankIdentity,
    bounded_job,
    checked_name,
    detected_launcher,
    kubernetes_job,
    launcher_job,
    launcher_run_id,
    rank_identity,
    script_name,
)

TRACEML_RUN_ID = "TRACEML_RUN_ID"
"""Run id shared by all ranks. ``traceml run`` sets it; else ``TORCHELASTIC_RUN_ID`` or generated."""
TRACEML_RUN_NAME = "TRACEML_RUN_NAME"
"""Human name of the run, used in the generated run id and the default service name."""
TRACEML_JOB = "TRACEML_JOB"
"""The job's identity across restarts (the ``traceml_job`` label); ``traceml run --run-name`` sets it.
Else ``SLURM_JOB_NAME``/``SLURM_JOB_ID``, then ``TORCHELASTIC_RUN_ID``; without any, the run id."""
TRACEML_K8S_NAMESPACE = "TRACEML_K8S_NAMESPACE"
"""The pod's namespace (downward API ``metadata.namespace``): part of the job identity."""
TRACEML_K8S_JOB = "TRACEML_K8S_JOB"
"""The Kubernetes Job (or JobSet) name (downward API, label ``batch.kubernetes.io/job-name``)."""
TRACEML_K8S_JOB_UID = "TRACEML_K8S_JOB_UID"
"""The Job's UID (downward API, label ``batch.kubernetes.io/controller-uid``)."""
TRACEML_LAUNCHER = "TRACEML_LAUNCHER"
"""Set by ``traceml run`` (which writes the manifest); without it rank 0 writes one itself."""
TRACEML_RUNS_DIR = "TRACEML_RUNS_DIR"
"""Parent folder of the local copies (default ``traceml-runs`` in the working directory)."""
TRACEML_LOCAL_COPY = "TRACEML_LOCAL_COPY"
"""``0`` turns the local OTLP-JSON copy off."""
TRACEML_DISABLED = "TRACEML_DISABLED"
"""``1`` makes ``init()`` a no-op."""
TRACEML_STRICT = "TRACEML_STRICT"
"""``1`` makes ``init()`` raise instead of warning when telemetry cannot start."""
TRACEML_FLUSH_STEPS = "TRACEML_FLUSH_STEPS"
"""Hand completed steps to the emitter every this many steps (default 256)."""
TRACEML_FLUSH_INTERVAL_MS = "TRACEML_FLUSH_INTERVAL_MS"
"""... or when this many milliseconds passed since the last hand-off (default 250)."""
TRACEML_SHUTDOWN_TIMEOUT_S = "TRACEML_SHUTDOWN_TIMEOUT_S"
"""How long exit waits for the emitter to finish OTLP export (default 10 s)."""
TRACEML_EMITTER_STALL_S = "TRACEML_EMITTER_STALL_S"
"""At exit, give the local copy up when the emitter took nothing for this long (default 30 s): a dead,
stopped or hung emitter; the trainer then records what it handed over in ``rank-R.handoff.json``."""
TRACEML_DIAGNOSIS_MEMORY_MB = "TRACEML_DIAGNOSIS_MEMORY_MB"
"""Address-space budget of ``traceml run``'s end-of-run diagnosis (default: a quarter of physical memory,
at least 2048); beyond it the diagnosis is skipped with one line and the script's exit code survives."""
TRACEML_TRACE_URL = "TRACEML_TRACE_URL"
"""Link template for trace ids in reports, with ``{trace_id}``: e.g. ``http://grafana:3000/explore?...``,
``http://jaeger:16686/trace/{trace_id}`` or ``http://tempo:3200/api/traces/{trace_id}``."""
TRACEML_PROMETHEUS_PORT = "TRACEML_PROMETHEUS_PORT"
"""If set, the emitter serves Prometheus metrics on ADDRESS:PORT+local_rank."""
TRACEML_PROMETHEUS_ADDR = "TRACEML_PROMETHEUS_ADDR"
"""Address the scrape endpoint binds: default 127.0.0.1; ``0.0.0.0`` or the pod IP lets a central
Prometheus (or a Kubernetes PodMonitor) scrape it."""
TRACEML_PROMETHEUS_LINGER_S = "TRACEML_PROMETHEUS_LINGER_S"
"""After the end, keep the scrape endpoint up at least this long (default 20 s; 0 turns it off), and longer
when a scraper was seen scraping less often (every replica must scrape the end marker once)."""
TRACEML_COLLECTIVES = "TRACEML_COLLECTIVES"
"""``0`` turns collective timing (DDP gradient all-reduce, ``torch.distributed`` calls) off."""
TRACEML_HANG_TIMEOUT_S = "TRACEML_HANG_TIMEOUT_S"
"""Floor of the hang timeout in seconds (default 60; ``0`` turns the hang watchdog off). A rank is hung
when it makes no progress for max(this, ``TRACEML_HANG_FACTOR`` x its longest recent step)."""
TRACEML_HANG_STARTUP_TIMEOUT_S = "TRACEML_HANG_STARTUP_TIMEOUT_S"
"""Seconds a rank may spend between ``init()`` and its first step (rendezvous, process-group init,
model build, checkpoint load) before its watchdog reports a hang ``before first step`` (default 900;
``0``: not watched before the first step)."""
TRACEML_HANG_FACTOR = "TRACEML_HANG_FACTOR"
"""How many times the longest of the last 64 step intervals a rank may go without progress (default 5)."""
TRACEML_PEAK_FLOPS = "TRACEML_PEAK_FLOPS"
"""Peak FLOP/s of one rank's device for MFU (e.g. ``989e12``); required on CPU and for devices
outside the table in ``docs/goodput.md``."""
TRACEML_MFU_DTYPE = "TRACEML_MFU_DTYPE"
"""Which column of the peak table MFU uses: ``bf16`` (default), ``fp16``, ``tf32``, ``fp32`` or ``fp8``."""
MFU_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
TRACEML_AUTO_ATTACH = "TRACEML_AUTO_ATTACH"
"""Zero-code tracing of scripts that never import traceml (see README, "Launching"): ``traceml run``
sets it to ``1`` and puts the start-up hook (:data:`traceml_otel.launch.bootstrap.BOOTSTRAP_DIR`) on
``PYTHONPATH``; ``0`` (or ``traceml run --no-auto-attach``) turns it off."""
TRACEML_AUTO = "TRACEML_AUTO"
"""``1`` turns zero-code tracing on for a direct launch (``torchrun``, ``accelerate launch``,
``python``), as ``traceml run`` does: the ``traceml-otel-auto.pth`` file installed with the package
loads the start-up hook (:mod:`traceml_otel.integrations.startup`) in each process that sees it, and the
training processes attach. ``TRACEML_AUTO_ATTACH=0`` still turns it off."""
TRACEML_INFER_STEPS = "TRACEML_INFER_STEPS"
"""Under zero-code tracing, ``0`` turns step inference for plain loops off (the framework callbacks stay)."""
TRACEML_BOOT_SCRIPT = "TRACEML_BOOT_SCRIPT"
"""Set by ``traceml run``: the script each rank runs, so the start-up hook attaches in the ranks only
(not in DataLoader workers, the emitter or other programs the script starts)."""
TRACEML_AUTO_ATTACHED_PID = "TRACEML_AUTO_ATTACHED_PID"
"""Set in a direct launch by the first process that attached: programs it starts do not attach."""
TRACEML_LAUNCHER_PID = "TRACEML_LAUNCHER_PID"
"""Set by ``traceml run`` to its own pid: a rank whose parent it is stops when it dies (capture/orphan.py)."""

TRACEML_OTLP_SPANS = "TRACEML_OTLP_SPANS"
"""The OTLP span budget's mode: ``auto`` (default: every span while the job is under the budget, a
consistent sample above it), ``all`` (every span, no budget) or ``sampled`` (a consistent sample at
``TRACEML_OTLP_SAMPLE_RATE``, lower if the budget needs it). Anomalous steps are always kept
(``emit/span_budget.py``). OTLP span export only: the local copy and the metrics are complete."""
TRACEML_OTLP_SAMPLE_RATE = "TRACEML_OTLP_SAMPLE_RATE"
"""The consistent sample's probability, ``0 < p <= 1`` (``sampled`` mode's default: 0.1)."""
TRACEML_OTLP_SPAN_BUDGET = "TRACEML_OTLP_SPAN_BUDGET"
"""Spans per second the whole job may send over OTLP (default 5000; 0: no budget)."""
OTLP_SPANS_MODES = ("auto", "all", "sampled")
DEFAULT_OTLP_SPAN_BUDGET = 5_000.0
"""At ~0.5 KB a span, about 2.5 MB/s: a sixth of Tempo's default per-tenant ingestion limit (15 MB/s)."""

PROMETHEUS_LINGER_MAX_S = 120.0
"""The longest the endpoint's linger grows to cover a scraper seen scraping less often (intervals up
to ~115 s); a ``TRACEML_PROMETHEUS_LINGER_S`` above it is used as given."""


def linger_budget_s(configured_s: float) -> float:
    """The most the endpoint may linger after the end (what exit waits for, at worst)."""
    return 0.0 if configured_s <= 0 else max(configured_s, PROMETHEUS_LINGER_MAX_S)


OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything traceml-otel needs to know from the environment, read once."""

    run_id: str
    run_name: str
    identity: RankIdentity
    job: str
    """The job identity shared by every attempt (restart) of a job: see :func:`job_identity`."""
    service_name: str | None
    """Our default service name, or None when OTEL_SERVICE_NAME/OTEL_RESOURCE_ATTRIBUTES set one."""
    run_dir: Path | None
    """Local copy folder, or None when the local copy is off."""
    traces: SignalExport | None
    metrics: SignalExport | None
    sampler: str
    sampler_arg: str | None
    sdk_disabled: bool
    strict: bool
    flush_steps: int
    flush_interval_ns: int
    shutdown_timeout_s: float
    prometheus_port: int | None
    prometheus_addr: str = "127.0.0.1"
    prometheus_linger_s: float = 0.0
    launcher: str = "python"
    """``traceml run`` (it writes the manifest), ``torchrun``, ``accelerate launch`` or ``python``."""
    emitter_stall_s: float = 30.0
    """How long exit waits for an emitter that takes nothing (``TRACEML_EMITTER_STALL_S``)."""
    collectives: bool = True
    """False when ``TRACEML_COLLECTIVES=0``: collective timing stays off whatever ``init()`` says."""
    hang_timeout_s: float = 60.0
    """Floor of the hang timeout (``TRACEML_HANG_TIMEOUT_S``); 0 turns the hang watchdog off."""
    hang_factor: float = 5.0
    hang_startup_timeout_s: float = 900.0
    """``TRACEML_HANG_STARTUP_TIMEOUT_S``: the hang timeout from ``init()`` to the first step."""
    """``TRACEML_HANG_FACTOR``: the timeout is at least this many times the longest recent step."""
    peak_flops: float | None = None
    """``TRACEML_PEAK_FLOPS``: one rank's peak FLOP/s, overriding the table (``None``: not set)."""
    mfu_dtype: str = "bf16"
    """``TRACEML_MFU_DTYPE``: the peak table's column."""
    otlp_spans: str = "auto"
    """``TRACEML_OTLP_SPANS``: ``auto``, ``all`` or ``sampled``."""
    otlp_sample_rate: float | None = None
    """``TRACEML_OTLP_SAMPLE_RATE`` (``None``: not set)."""
    otlp_span_budget: float = DEFAULT_OTLP_SPAN_BUDGET
    """``TRACEML_OTLP_SPAN_BUDGET``: the job's spans per second over OTLP (0: no budget)."""


def auto_attach_requested(env: Mapping[str, str] | None = None) -> tuple[bool, bool]:
    """(attach the framework callbacks, infer steps in plain loops) for a process that loaded the
    start-up hook: on unless ``TRACEML_AUTO_ATTACH``/``TRACEML_INFER_STEPS`` say ``0``."""
    env = os.environ if env is None else env
    attach = flag(env, TRACEML_AUTO_ATTACH, default=True)
    return attach, attach and flag(env, TRACEML_INFER_STEPS, default=True)


def auto_requested(env: Mapping[str, str] | None = None) -> bool:
    """``TRACEML_AUTO``: on for ``1``/``true``/``yes``/``on``, off unset or ``0``/``false``/``no``/``off``;
    any other value is a :class:`SettingsError` (a typo must not look like a silent opt-out)."""
    return flag(os.environ if env is None else env, TRACEML_AUTO)


def strict_requested(env: Mapping[str, str] | None = None) -> bool:
    """``TRACEML_STRICT`` on its own, readable when the other settings are unusable: an unusable value
    of its own reads as off here (:func:`load_settings` has refused it, and ``init()`` says so)."""
    try:
        return flag(os.environ if env is None else env, TRACEML_STRICT)
    except SettingsError:
        return False


SHUTDOWN_TIMEOUT_DEFAULT_S = 10.0


def shutdown_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``TRACEML_SHUTDOWN_TIMEOUT_S`` as every rank reads it (the launcher waits as long for the ranks'
    last exports). Raises :class:`SettingsError` on an unusable value."""
    return decimal(os.environ if env is None else env, TRACEML_SHUTDOWN_TIMEOUT_S, SHUTDOWN_TIMEOUT_DEFAULT_S)


def explicit_run_id(env: Mapping[str, str] | None = None) -> str | None:
    """``TRACEML_RUN_ID`` when set (surrounding blanks dropped), else None."""
    return (os.environ if env is None else env).get(TRACEML_RUN_ID, "").strip() or None


def explicit_job(env: Mapping[str, str] | None = None) -> str | None:
    """``TRACEML_JOB`` when set (surrounding blanks dropped), else None."""
    return (os.environ if env is None else env).get(TRACEML_JOB, "").strip() or None


def runs_dir(env: Mapping[str, str] | None = None) -> Path:
    """The parent folder of the run folders (``TRACEML_RUNS_DIR``, else ``traceml-runs``), resolved:
    a link at the run folder itself is then refused, never followed."""
    raw = (os.environ if env is None else env).get(TRACEML_RUNS_DIR, "").strip()
    return Path(raw or RUNS_DIR_DEFAULT).resolve()


def launcher_pid(env: Mapping[str, str] | None = None) -> int | None:
    """The ``traceml run`` launcher's pid (``TRACEML_LAUNCHER_PID``), or None outside one."""
    raw = (os.environ if env is None else env).get(TRACEML_LAUNCHER_PID, "").strip()
    return int(raw) if raw.isdigit() else None


def boot_script(env: Mapping[str, str] | None = None) -> str | None:
    """The script ``traceml run`` runs in each rank (``TRACEML_BOOT_SCRIPT``), or None."""
    return (os.environ if env is None else env).get(TRACEML_BOOT_SCRIPT) or None


def auto_attached_pid(env: Mapping[str, str] | None = None) -> str | None:
    """The pid of the process that attached first in a direct launch (``TRACEML_AUTO_ATTACHED_PID``)."""
    return (os.environ if env is None else env).get(TRACEML_AUTO_ATTACHED_PID) or None


DIAGNOSIS_MEMORY_MIN_MB = 2048


def diagnosis_memory_mb(env: Mapping[str, str] | None = None) -> int:
    """The end-of-run diagnosis' address-space budget: ``TRACEML_DIAGNOSIS_MEMORY_MB``, else a quarter
    of physical memory (at least 2 GiB). A value that is not a positive whole number counts as unset."""
    raw = (os.environ if env is None else env).get(TRACEML_DIAGNOSIS_MEMORY_MB, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = 8 << 30
    return max(DIAGNOSIS_MEMORY_MIN_MB, physical // 4 >> 20)


def _run_id(env: Mapping[str, str], run_name: str) -> str:
    explicit = explicit_run_id(env)
    return checked_name(TRACEML_RUN_ID, explicit) if explicit else launcher_run_id(env, run_name)


def job_identity(env: Mapping[str, str], run_id: str, run_name: str = "run") -> str:
    """The label that stays the same when a job restarts under a new run id.

    ``TRACEML_JOB`` (set by the user, or by ``traceml run --run-name`` where no scheduler identity
    exists), else the Kubernetes Job (namespace, name, UID) or the Slurm job
    (``[SLURM_CLUSTER_NAME/]SLURM_JOB_NAME-SLURM_JOB_ID``: a requeued job keeps its id), else
    torchrun's rendezvous id
    (``TORCHELASTIC_RUN_ID``, the same for every elastic restart; not under ``traceml run``, whose
    standalone rendezvous id is new each launch), else the run id itself: without an identity each
    attempt is a job of its own (docs/observability-stack.md, "A job's whole life").
    """
    under_traceml_run = bool(env.get(TRACEML_LAUNCHER))
    job = (explicit_job(env) or scheduler_job(env)
           or launcher_job(env, run_name, under_traceml_run=under_traceml_run) or run_id)
    return bounded_job(job) or run_id


def scheduler_job(env: Mapping[str, str]) -> str | None:
    """What the scheduler assigned, or None: the Kubernetes Job (``TRACEML_K8S_NAMESPACE``,
    ``TRACEML_K8S_JOB``, ``TRACEML_K8S_JOB_UID``: ``<namespace>/<name>/<uid8>``), else the Slurm job
    (with its cluster). ``traceml run --run-name`` names the job only where there is none of these."""
    kubernetes = kubernetes_job(env.get(TRACEML_K8S_NAMESPACE, ""), env.get(TRACEML_K8S_JOB, ""),
                                env.get(TRACEML_K8S_JOB_UID, ""))
    if kubernetes:
        return kubernetes
    return launcher_job(env, "", under_traceml_run=True)  # Slurm only (torchrun's id is not a scheduler's)


def launcher_name(env: Mapping[str, str]) -> str:
    """Who started this process: ``traceml run`` (it sets ``TRACEML_LAUNCHER``), ``accelerate
    launch``, ``torchrun`` or ``python``."""
    return "traceml run" if env.get(TRACEML_LAUNCHER) else detected_launcher(env)


def _signal_export(
    env: Mapping[str, str], exporter_var: str, endpoint_var: str, protocol_var: str
) -> SignalExport | None:
    return signal_export(
        exporter=env.get(exporter_var, "otlp"),
        endpoint=env.get(endpoint_var) or env.get(OTEL_EXPORTER_OTLP_ENDPOINT) or "",
        protocol=env.get(protocol_var) or env.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "",
    )


def _service_name_is_set(env: Mapping[str, str]) -> bool:
    if env.get(OTEL_SERVICE_NAME, "").strip():
        return True
    pairs = env.get(OTEL_RESOURCE_ATTRIBUTES, "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)


def trace_url_template(value: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The trace link template (``value``, else ``TRACEML_TRACE_URL``), checked; ``None`` when unset.

    It must be an http(s) URL containing ``{trace_id}`` (reports put it in HTML links).
    """
    raw = (value if value is not None else (os.environ if env is None else env).get(TRACEML_TRACE_URL, ""))
    raw = raw.strip()
    if not raw:
        return None
    if "{trace_id}" not in raw:
        raise SettingsError(f"trace URL template {raw!r} has no {{trace_id}} placeholder")
    if urlparse(raw.replace("{trace_id}", "0")).scheme not in ("http", "https"):
        raise SettingsError(f"trace URL template {raw!r} is not an http(s) URL")
    return raw


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Parse the environment once. Raises :class:`SettingsError` on unusable values."""
    env = os.environ if env is None else env
    given_name = env.get(TRACEML_RUN_NAME, "").strip()
    run_name = checked_name(TRACEML_RUN_NAME, given_name) if given_name else script_name()
    run_id = _run_id(env, run_name)
    job = job_identity(env, run_id, run_name)
    local_copy = flag(env, TRACEML_LOCAL_COPY, default=True)
    port = whole_number(env, TRACEML_PROMETHEUS_PORT, 0, minimum=0)
    return Settings(
        run_id=run_id,
        run_name=run_name,
        identity=rank_identity(env),
        job=job,
        service_name=None if _service_name_is_set(env) else f"traceml-{run_name}",
        run_dir=runs_dir(env) / run_id if local_copy else None,
        traces=_signal_export(
            env, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
        ),
        metrics=_signal_export(
            env, OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
            OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
        ),
        sampler=env.get(OTEL_TRACES_SAMPLER, "parentbased_always_on").strip().lower(),
        sampler_arg=env.get(OTEL_TRACES_SAMPLER_ARG),
        sdk_disabled=otel_true(env, OTEL_SDK_DISABLED) or flag(env, TRACEML_DISABLED),
        strict=flag(env, TRACEML_STRICT),
        flush_steps=whole_number(env, TRACEML_FLUSH_STEPS, 256),
        flush_interval_ns=whole_number(env, TRACEML_FLUSH_INTERVAL_MS, 250) * 1_000_000,
        shutdown_timeout_s=shutdown_timeout_s(env),
        prometheus_port=port or None,
        prometheus_addr=_bind_address(env),
        prometheus_linger_s=decimal(env, TRACEML_PROMETHEUS_LINGER_S, 20.0) if port else 0.0,
        launcher=launcher_name(env),
        emitter_stall_s=decimal(env, TRACEML_EMITTER_STALL_S, 30.0, minimum=1.0),
        collectives=flag(env, TRACEML_COLLECTIVES, default=True),
        hang_timeout_s=decimal(env, TRACEML_HANG_TIMEOUT_S, 60.0),
        hang_factor=decimal(env, TRACEML_HANG_FACTOR, 5.0, minimum=1.0),
        hang_startup_timeout_s=decimal(env, TRACEML_HANG_STARTUP_TIMEOUT_S, 900.0),
        peak_flops=_peak_flops(env),
        mfu_dtype=_mfu_dtype(env),
        otlp_spans=_otlp_spans(env),
        otlp_sample_rate=_sample_rate(env),
        otlp_span_budget=decimal(env, TRACEML_OTLP_SPAN_BUDGET, DEFAULT_OTLP_SPAN_BUDGET),
    )


def _otlp_spans(env: Mapping[str, str]) -> str:
    raw = env.get(TRACEML_OTLP_SPANS, "").strip().lower() or "auto"
    if raw not in OTLP_SPANS_MODES:
        raise SettingsError(f"{TRACEML_OTLP_SPANS}={raw!r} is not one of {', '.join(OTLP_SPANS_MODES)}")
    return raw


def _sample_rate(env: Mapping[str, str]) -> float | None:
    if not env.get(TRACEML_OTLP_SAMPLE_RATE, "").strip():
        return None
    value = decimal(env, TRACEML_OTLP_SAMPLE_RATE, 1.0)
    if not 0 < value <= 1:
        raise SettingsError(f"{TRACEML_OTLP_SAMPLE_RATE}={value:g} must be a probability, 0 < p <= 1")
    return value


def _peak_flops(env: Mapping[str, str]) -> float | None:
    raw = env.get(TRACEML_PEAK_FLOPS, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{TRACEML_PEAK_FLOPS}={raw!r} is not a number of FLOP/s (e.g. 989e12)") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"{TRACEML_PEAK_FLOPS}={raw!r} must be a positive number of FLOP/s")
    return value


def _mfu_dtype(env: Mapping[str, str]) -> str:
    raw = env.get(TRACEML_MFU_DTYPE, "").strip().lower() or "bf16"
    if raw not in MFU_DTYPES:
        raise SettingsError(f"{TRACEML_MFU_DTYPE}={raw!r} is not one of {', '.join(MFU_DTYPES)}")
    return raw


def _bind_address(env: Mapping[str, str]) -> str:
    raw = env.get(TRACEML_PROMETHEUS_ADDR, "").strip()
    if not raw:
        return "127.0.0.1"
    try:
        ipaddress.ip_address(raw.strip("[]"))
    except ValueError:
        raise SettingsError(f"{TRACEML_PROMETHEUS_ADDR}={raw!r} is not an IP address") from None
    return raw.strip("[]")


TRACEML_LIVE = "TRACEML_LIVE"
"""``traceml run``'s live view: ``auto`` (default), ``panel``, ``lines`` or ``off`` (``--live``)."""
TRACEML_LIVE_INTERVAL_S = "TRACEML_LIVE_INTERVAL_S"
"""Seconds between live lines (``--live-interval``; default 30)."""
LIVE_VIEW_MODES = ("auto", "panel", "lines", "off")


def live_mode(env: Mapping[str, str] | None = None) -> str:
    """``TRACEML_LIVE`` checked (``auto`` when unset); raises :class:`SettingsError` on another value."""
    env = os.environ if env is None else env
    raw = env.get(TRACEML_LIVE, "").strip().lower() or "auto"
    if raw not in LIVE_VIEW_MODES:
        raise SettingsError(f"{TRACEML_LIVE}={raw!r} is not one of {', '.join(LIVE_VIEW_MODES)}")
    return raw


def live_interval_s(env: Mapping[str, str] | None = None) -> float:
    """``TRACEML_LIVE_INTERVAL_S`` (default 30, at least 1)."""
    return decimal(os.environ if env is None else env, TRACEML_LIVE_INTERVAL_S, 30.0, minimum=1.0)


TRACEML_CAPTURE = "TRACEML_CAPTURE"
"""Deep captures (``docs/captures.md``): ``1`` (default) lets a rank take a ``torch.profiler`` trace of a few
steps when a trigger fires or one is asked for (``traceml capture``); ``0`` turns them off."""
TRACEML_CAPTURE_AUTO = "TRACEML_CAPTURE_AUTO"
"""``0`` keeps on-demand captures but turns the automatic triggers (spike, drift, residual jump) off."""
TRACEML_CAPTURE_STEPS = "TRACEML_CAPTURE_STEPS"
"""Steps one capture covers (default 3)."""
TRACEML_CAPTURE_INTERVAL_S = "TRACEML_CAPTURE_INTERVAL_S"
"""At most one capture per rank per this many seconds (default 600)."""
TRACEML_CAPTURE_MAX = "TRACEML_CAPTURE_MAX"
"""At most this many captures per rank per run (default 3)."""
TRACEML_CAPTURE_MAX_RUN = "TRACEML_CAPTURE_MAX_RUN"
"""At most this many capture traces in a run folder, all ranks together (default 32)."""
TRACEML_CAPTURE_MAX_MB = "TRACEML_CAPTURE_MAX_MB"
"""At most this many MiB of capture traces in a run folder (default 256); one trace is capped at a quarter."""
TRACEML_CAPTURE_SPIKE_K = "TRACEML_CAPTURE_SPIKE_K"
"""A step is a spike when its busy time exceeds this many times the rank's rolling p95 (default 3)."""
TRACEML_CAPTURE_DRIFT = "TRACEML_CAPTURE_DRIFT"
"""A slow period: the median busy time of the last 16 steps over this many times the baseline median."""
TRACEML_CAPTURE_STACK = "TRACEML_CAPTURE_STACK"
"""``0`` turns Python stacks off in captures (``with_stack``; default on)."""
TRACEML_CAPTURE_SHAPES = "TRACEML_CAPTURE_SHAPES"
"""``1`` records operator input shapes in captures (``record_shapes``; default off)."""
TRACEML_CAPTURE_POLL_S = "TRACEML_CAPTURE_POLL_S"
"""How often a rank looks for a capture request (default 0.2 s; off the training thread)."""
TRACEML_CAPTURE_BUDGET = "TRACEML_CAPTURE_BUDGET"
"""Automatic captures together may cost at most this share of a rank's training time so far (default
0.01; ``traceml_otel/capture/capture_budget.py``)."""
TRACEML_CAPTURE_WASTE_SHARE = "TRACEML_CAPTURE_WASTE_SHARE"
"""...or this share of the time the triggering anomaly already wasted, whichever is larger (default 0.5;
``0``: the training-time share alone)."""


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    """What deep captures may do (``TRACEML_CAPTURE_*``): triggers, limits, profiler options."""

    enabled: bool = True
    auto: bool = True
    steps: int = 3
    interval_s: float = 600.0
    max_per_rank: int = 3
    max_per_run: int = 32
    max_run_bytes: int = 256 << 20
    spike_k: float = 3.0
    drift_factor: float = 1.5
    with_stack: bool = True
    record_shapes: bool = False
    poll_s: float = 0.2
    budget_share: float = 0.01
    waste_share: float = 0.5


def capture_settings(env: Mapping[str, str] | None = None) -> CaptureSettings:
    """``TRACEML_CAPTURE_*`` checked (the trainer's poller and the emitter's triggers read the same)."""
    env = os.environ if env is None else env
    return CaptureSettings(
        enabled=flag(env, TRACEML_CAPTURE, default=True),
        auto=flag(env, TRACEML_CAPTURE_AUTO, default=True),
        steps=min(whole_number(env, TRACEML_CAPTURE_STEPS, 3), 50),
        interval_s=decimal(env, TRACEML_CAPTURE_INTERVAL_S, 600.0),
        max_per_rank=whole_number(env, TRACEML_CAPTURE_MAX, 3, minimum=0),
        max_per_run=whole_number(env, TRACEML_CAPTURE_MAX_RUN, 32, minimum=0),
        max_run_bytes=whole_number(env, TRACEML_CAPTURE_MAX_MB, 256) << 20,
        spike_k=decimal(env, TRACEML_CAPTURE_SPIKE_K, 3.0, minimum=1.0),
        drift_factor=decimal(env, TRACEML_CAPTURE_DRIFT, 1.5, minimum=1.0),
        with_stack=flag(env, TRACEML_CAPTURE_STACK, default=True),
        record_shapes=flag(env, TRACEML_CAPTURE_SHAPES),
        poll_s=decimal(env, TRACEML_CAPTURE_POLL_S, 0.2, minimum=0.01),
        budget_share=decimal(env, TRACEML_CAPTURE_BUDGET, 0.01),
        waste_share=decimal(env, TRACEML_CAPTURE_WASTE_SHARE, 0.5),
    )
