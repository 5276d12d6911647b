"""The hello: the first frame a training process sends its emitter.

It says who the rank is, where its telemetry goes, how long shutdown may spend on OTLP export,
and the clock anchor that puts the rank's ``perf_counter_ns`` readings on the epoch clock. The
trainer builds a :class:`Hello` from its settings once, at ``init()``; the emitter reads every
field. :func:`decode_hello` checks the stream's version first: an emitter never guesses at a
stream of another version, it refuses it (:class:`WireVersionError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from traceml_otel.wire.fields import decode_fields
from traceml_otel.wire.frames import WIRE_VERSION, WireError, encode_frame

HELLO = "hello"
"""The frame type (``t``) of a hello."""

ResourceValue = str | bool | int | float


@dataclass(frozen=True, slots=True)
class Hello:
    """Everything the emitter needs from the trainer, sent once before any step."""

    run_id: str
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    host: str
    pid: int
    """The training process (``process.pid`` on the resource)."""
    anchor_ns: int
    """``time.time_ns() - time.perf_counter_ns()`` in the trainer, read bracketed
    (``capture/clock_anchor.py``): added to every step row's readings."""
    shutdown_timeout_s: float
    """``TRACEML_SHUTDOWN_TIMEOUT_S``: the emitter's whole OTLP drain (spans, then metrics) at shutdown."""
    service_name: str | None = None
    """Our default ``service.name``; None when ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` set one."""
    run_dir: str | None = None
    """Folder of the local copy and ``rank-R.export.json``; None when the local copy is off."""
    traces_endpoint: str | None = None
    """OTLP span export endpoint (with ``traces_protocol``); None when spans are not exported."""
    traces_protocol: str | None = None
    """``grpc`` or ``http/protobuf``."""
    metrics_endpoint: str | None = None
    """OTLP metric export endpoint (with ``metrics_protocol``, shown in the account); None when metrics
    are not exported over OTLP."""
    metrics_protocol: str | None = None
    """OTLP metric export protocol."""
    sampler: str = "parentbased_always_on"
    """``OTEL_TRACES_SAMPLER`` (OTLP export only; the local copy keeps every step)."""
    sampler_arg: str | None = None
    """``OTEL_TRACES_SAMPLER_ARG``."""
    prometheus_port: int | None = None
    """Base port of the Prometheus endpoint (the emitter adds its local rank); None: no endpoint."""
    prometheus_addr: str = "127.0.0.1"
    prometheus_linger_s: float = 0.0
    """How long the endpoint waits at the end for a scrape that sees the end marker."""
    cpus: int | None = None
    """CPUs the training process may run on (``traceml.host.cpus``)."""
    user_resource: Mapping[str, ResourceValue] = field(default_factory=dict)
    """Attributes of a ``TracerProvider`` the program set up itself; merged over ours."""
    job: str = ""
    """The job identity across restarts (``traceml_job``); empty: the run id."""
    otlp_spans: str = "auto"
    """``TRACEML_OTLP_SPANS`` (the span budget's mode)."""
    otlp_sample_rate: float | None = None
    """``TRACEML_OTLP_SAMPLE_RATE``."""
    otlp_span_budget: float = 5_000.0
    """``TRACEML_OTLP_SPAN_BUDGET`` (spans per second for the whole job; 0: none)."""


class WireVersionError(WireError):
    """The trainer speaks another version of the stream than this emitter reads."""

    def __init__(self, sent: object, rank: int | None) -> None:
        self.sent = sent
        self.rank = rank
        super().__init__(f"the trainer sent wire version {sent!r}, this emitter reads {WIRE_VERSION}")


_INT = (int,)
_NUMBER = (int, float)
_TEXT = (str,)
_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": _TEXT, "rank": _INT, "local_rank": _INT, "world_size": _INT, "node_rank": _INT,
    "host": _TEXT, "pid": _INT, "anchor_ns": _INT, "shutdown_timeout_s": _NUMBER,
    "service_name": _TEXT, "run_dir": _TEXT, "traces_endpoint": _TEXT, "traces_protocol": _TEXT,
    "metrics_endpoint": _TEXT, "metrics_protocol": _TEXT, "sampler": _TEXT, "sampler_arg": _TEXT,
    "prometheus_port": _INT,
    "prometheus_addr": _TEXT, "prometheus_linger_s": _NUMBER, "cpus": _INT, "user_resource": (dict,),
    "job": _TEXT, "otlp_spans": _TEXT, "otlp_sample_rate": _NUMBER, "otlp_span_budget": _NUMBER,
}
"""What each field may hold on the wire (None as well, where the field's default is None)."""


def encode_hello(hello: Hello) -> bytes:
    """The hello frame, with this side's ``WIRE_VERSION`` in ``v``."""
    body = {f.name: getattr(hello, f.name) for f in fields(Hello)}
    body["user_resource"] = dict(hello.user_resource)
    return encode_frame({"t": HELLO, "v": WIRE_VERSION, **body})


def decode_hello(frame: Mapping[str, Any]) -> Hello:
    """The hello in ``frame``, checked.

    Raises :class:`WireVersionError` when the version is not ours (``rank`` is read for the
    message when it is an int), and :class:`WireError` when the frame is not a hello or a field
    is missing or of the wrong type. Keys this version does not know are ignored.
    """
    if frame.get("t") != HELLO:
        raise WireError(f"the first frame is a {str(frame.get('t'))[:40]!r}, not a hello")
    version = frame.get("v")
    if version != WIRE_VERSION or isinstance(version, bool):
        rank = frame.get("rank")
        raise WireVersionError(version, rank if type(rank) is int else None)
    values = decode_fields(Hello, frame, _TYPES, "hello")
    for signal in ("traces", "metrics"):
        if (values.get(f"{signal}_endpoint") is None) != (values.get(f"{signal}_protocol") is None):
            raise WireError(f"the hello gives a {signal} endpoint or protocol without the other")
    resource = values.get("user_resource") or {}
    if not all(isinstance(value, (str, bool, int, float)) for value in resource.values()):
        raise WireError("the hello's user_resource holds a value that is not a string, bool or number")
    return Hello(**values)
