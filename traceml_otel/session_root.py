"""The composition root: ``init()`` builds this rank's training session from the settings.

It alone joins the layers: the emitter channel (``emit/``), the ``Hello`` its pipe starts with
(``wire/``), a direct launch's manifest (``launch/``) and the session itself (``capture/``), which
then becomes :func:`traceml_otel.capture.session.current`. It also keeps ``init()``'s one-call rule
(same arguments again: nothing; different ones: an error, unless zero-code tracing made the first
call, whose configuration the script's own ``init()`` then replaces).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

from traceml_otel.capture import process_hooks
from traceml_otel.capture import session as sessions
from traceml_otel.capture.capture_config import CaptureConfig, config_difference
from traceml_otel.capture.clock_anchor import wall_anchor_ns
from traceml_otel.capture.session import TrainingSession
from traceml_otel.settings import Settings, load_settings, strict_requested
from traceml_otel.warn_line import warn
from traceml_otel.wire.hello import Hello

if TYPE_CHECKING:
    from traceml_otel.launch.direct import DirectManifest

_lock = threading.Lock()
_init_config: tuple[CaptureConfig, bool] | None = None
_auto_started = False
"""True when zero-code tracing called ``init()`` (a later ``init()`` of the script's then reconfigures)."""


def init_called() -> bool:
    """``init()`` was called in this process (whatever came of it)."""
    return _init_config is not None


def start(config: CaptureConfig, *, disabled: bool = False, strict: bool | None = None) -> bool:
    """``init()``: start the session once; True when telemetry is active (see the module's docstring)."""
    global _init_config
    with _lock:
        if _init_config is not None:
            return _again(config, disabled)
        _init_config = (config, disabled)
        try:
            settings = load_settings()
        except ValueError as error:
            if strict or (strict is None and strict_requested()):
                raise
            warn(f"telemetry disabled: {error}")
            return False
        if disabled or settings.sdk_disabled:
            return False
        try:
            session = build_session(config, settings)
        except Exception as error:
            if strict or (strict is None and settings.strict):
                raise
            warn(f"telemetry could not start and is off for this run: {type(error).__name__}: {error}")
            return False
        sessions.install(session)
        process_hooks.install()
        _announce(settings)
        return True


def _announce(settings: Settings) -> None:
    """A direct launch's start line, from local rank 0 (``traceml run``'s launcher prints its own)."""
    from traceml_otel.launch.start_line import direct_launch_prints, print_start_line

    if direct_launch_prints(settings):
        print_start_line(settings)


def _again(config: CaptureConfig, disabled: bool) -> bool:
    """A second ``init()``: nothing, a reconfiguration after zero-code tracing's, or an error."""
    global _init_config
    assert _init_config is not None
    current = sessions.current()
    if _init_config == (config, disabled):
        return current.active
    if not _auto_started:
        raise RuntimeError("traceml.init() was already called with a different configuration: "
                           + config_difference(_init_config, (config, disabled)))
    if disabled:
        warn("init(disabled=True) comes after zero-code tracing started telemetry; turn it "
             "off with traceml run --no-auto-attach or TRACEML_AUTO_ATTACH=0")
        return current.active
    _init_config = (config, disabled)
    current.reconfigure(config)
    return current.active


def start_automatically() -> bool:
    """``init()`` on behalf of zero-code tracing: a later ``init(...)`` of the script's own may still
    choose another configuration (the hooks are swapped, not refused)."""
    global _auto_started
    if _init_config is not None:
        return sessions.current().active
    from traceml_otel.capture.capture_config import capture_config

    active = start(capture_config("auto", {}))
    _auto_started = True
    return active


def build_session(config: CaptureConfig, settings: Settings) -> TrainingSession:
    """This rank's session: the channel to a new emitter process, the manifest, the hooks."""
    from traceml_otel.emit.channel import EmitterChannel

    link = EmitterChannel(hello(settings))
    return TrainingSession(config, settings, link, manifest=_start_direct_manifest(settings))


def _start_direct_manifest(settings: Settings) -> DirectManifest | None:
    """Rank 0 of a run ``traceml run`` did not launch writes ``manifest.json`` (never fatal)."""
    if settings.run_dir is None or settings.identity.rank != 0 or settings.launcher == "traceml run":
        return None
    from traceml_otel.launch.direct import DirectManifest

    try:
        return DirectManifest.start(
            settings.run_dir, run_id=settings.run_id, run_name=settings.run_name,
            world_size=settings.identity.world_size, launcher=settings.launcher,
        )
    except OSError as error:
        warn(f"could not write the run manifest in {settings.run_dir}: {error}")
        return None


def user_resource_attributes() -> dict[str, str | bool | int | float]:
    """The resource of a TracerProvider the program already set up, if any.

    We never replace a global provider. Our spans are built in the emitter process (building
    them here would put 60-80 us per span back on the training thread), so the user's span
    processors do not see them; instead they carry the user's resource, so they land under the
    same service and attributes as the program's own telemetry.
    """
    trace_module = sys.modules.get("opentelemetry.trace")
    if trace_module is None:
        return {}
    resource = getattr(trace_module.get_tracer_provider(), "resource", None)
    attributes = getattr(resource, "attributes", None) or {}
    return {key: value for key, value in attributes.items() if isinstance(value, (str, bool, int, float))}


def hello(settings: Settings) -> Hello:
    """What this rank's emitter needs to know, for the first frame on its pipe."""
    identity = settings.identity
    return Hello(
        run_id=settings.run_id, rank=identity.rank, local_rank=identity.local_rank,
        world_size=identity.world_size, node_rank=identity.node_rank, host=identity.host, pid=os.getpid(),
        anchor_ns=wall_anchor_ns(), shutdown_timeout_s=settings.shutdown_timeout_s,
        service_name=settings.service_name, run_dir=str(settings.run_dir) if settings.run_dir else None,
        traces_endpoint=settings.traces.endpoint if settings.traces else None,
        traces_protocol=settings.traces.protocol if settings.traces else None,
        metrics_endpoint=settings.metrics.endpoint if settings.metrics else None,
        metrics_protocol=settings.metrics.protocol if settings.metrics else None,
        sampler=settings.sampler, sampler_arg=settings.sampler_arg,
        prometheus_port=settings.prometheus_port, prometheus_addr=settings.prometheus_addr,
        prometheus_linger_s=settings.prometheus_linger_s, cpus=_usable_cpus(),
        user_resource=user_resource_attributes(), job=settings.job,
        otlp_spans=settings.otlp_spans, otlp_sample_rate=settings.otlp_sample_rate,
        otlp_span_budget=settings.otlp_span_budget,
    )


def _usable_cpus() -> int | None:
    """CPUs this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
