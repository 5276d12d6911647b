"""OTLP export of spans from the emitter: the SDK's exporters, with every drop counted.

The SDK's ``BatchSpanProcessor`` evicts spans silently when its queue is full and does
not report failed exports, so the emitter ships batches itself: a bounded queue, one
thread calling the SDK exporter's ``export()``, and counters for what was sent, what
failed and what never left before the shutdown deadline. Header values (tokens) are
read by the SDK exporters from the environment and never printed here.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Sampler,
    TraceIdRatioBased,
)

from traceml_otel.contract import SPAN_STEP
from traceml_otel.emit.export_errors import failure_cause, install_log_recorder
from traceml_otel.emit.otlp_encode import EncodedSpans
from traceml_otel.emit.span_budget import Kept
from traceml_otel.emit.spans import SpanData
from traceml_otel.emit.step_protobuf import EncodedStep

MAX_QUEUED_SPANS = 200_000
MAX_BATCH_SPANS = 2048
"""Spans per export call at most (about 0.7 MB of our 4-span steps). A gRPC export call costs about
0.2 ms of CPU besides its bytes: when steps come fast, calls of 512 spans cost the emitter process
1-3.5 us a step more than calls of 2,048 (``benchmarks/emitter_cost.py --otlp``, 4,000 steps to rotel)."""
MAX_BATCH_BYTES = 1 << 20
"""Encoded bytes per export call at most (the OTLP receivers' gRPC default limit is 4 MiB)."""
BATCH_DELAY_S = 1.0


def make_span_exporter(protocol: str) -> SpanExporter:
    """The SDK OTLP span exporter for ``protocol``; it reads endpoint, headers, TLS from env.

    It also takes :class:`~traceml_otel.emit.otlp_encode.EncodedSpans` (our spans already encoded)
    and sends their bytes with the SDK's own transport, retries and settings; ``ReadableSpan`` lists
    still go through the SDK's encoder.
    """
    if protocol == "grpc":
        return _encoded_grpc_exporter()()
    return _encoded_http_exporter()()


_GRPC_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
"""The OTLP trace service's one method (fixed by the OTLP specification)."""


def _encoded_grpc_exporter() -> type[SpanExporter]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    def serialize(request: Any) -> bytes:
        """Our request bytes as they are; a message the SDK encoded, serialised as its own stub does."""
        return request if isinstance(request, bytes) else request.SerializeToString()

    class PassThroughStub:
        """The trace service stub, with a serializer that sends our already encoded bytes unchanged
        (the generated stub's would need them parsed into a message first: 4-7 us per step)."""

        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                _GRPC_EXPORT_METHOD, request_serializer=serialize,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )

    class EncodedGrpcSpanExporter(OTLPSpanExporter):
        """The SDK's gRPC exporter (channel, TLS, headers, compression, timeout, retries and reconnects
        all its own) sending a pre-encoded batch's bytes as they are.

        It replaces the stub the SDK builds on each (re)connection (``_initialize_channel_and_stub``,
        a private method of SDK 1.3x-1.4x); where that method is missing, the batch is parsed (in C)
        into the request message instead, as before."""

        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()
            self._client = PassThroughStub(self._channel)

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, EncodedSpans):
                if isinstance(getattr(self, "_client", None), PassThroughStub):
                    return data.request_bytes()
                return ExportTraceServiceRequest.FromString(data.request_bytes())
            return super()._translate_data(data)

    return EncodedGrpcSpanExporter


def _encoded_http_exporter() -> type[SpanExporter]:
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    if not getattr(trace_exporter.encode_spans, "_traceml_encoded", False):
        sdk_encode = trace_exporter.encode_spans

        def encode_spans(spans: Any) -> Any:
            """The SDK's encoder, or the bytes of a batch we encoded ourselves (this process is ours)."""
            if isinstance(spans, EncodedSpans):
                return _Serialized(spans.request_bytes())
            return sdk_encode(spans)

        encode_spans._traceml_encoded = True  # type: ignore[attr-defined]
        trace_exporter.encode_spans = encode_spans
    return trace_exporter.OTLPSpanExporter


class _Serialized:
    """What the SDK's HTTP exporter calls ``SerializePartialToString`` on: bytes already serialised."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def SerializePartialToString(self) -> bytes:  # the protobuf method's name
        return self._data

    SerializeToString = SerializePartialToString


def quiet_sdk_exporter_logs() -> None:
    """The SDK logs every retry; we keep those records (for the cause of a failure) and report
    failures once, with counts, ourselves."""
    install_log_recorder()


def sampler_from_settings(name: str, arg: str | None) -> Sampler:
    """The sampler named by ``OTEL_TRACES_SAMPLER``; step spans are roots, so ``parentbased_x`` is ``x``."""
    base = name.removeprefix("parentbased_")
    if base == "always_off":
        return ALWAYS_OFF
    if base == "traceidratio":
        try:
            ratio = float(arg) if arg not in (None, "") else 1.0
        except ValueError:
            ratio = 1.0
        return TraceIdRatioBased(min(1.0, max(0.0, ratio)))
    return ALWAYS_ON


@dataclass(slots=True)
class ExportCounts:
    """What happened to the spans offered to OTLP export."""

    sampled_out: int = 0
    """Spans ``OTEL_TRACES_SAMPLER`` left out (by design, not loss)."""
    budget_dropped: int = 0
    """Spans the span budget left out (``TRACEML_OTLP_SPANS``; by design, not loss)."""
    exported: int = 0
    failed: int = 0
    queue_full: int = 0
    not_sent_at_shutdown: int = 0
    last_error: str | None = None

    @property
    def dropped(self) -> int:
        return self.failed + self.queue_full + self.not_sent_at_shutdown


class OtlpSpanShipper:
    """Sends spans through an SDK exporter on its own thread, counting every outcome."""

    def __init__(
        self,
        exporter: SpanExporter,
        sampler: Sampler,
        endpoint: str,
        convert: Callable[[SpanData], Any],
        on_first_failure: Callable[[str], None] | None = None,
        protocol: str = "",
        batch: Callable[[list[Any]], Sequence[Any]] = list,
        convert_kept: Callable[[Sequence[SpanData] | EncodedStep, Kept], list[Any]] | None = None,
    ) -> None:
        """``convert`` turns one span into what ``exporter`` takes (a ``ReadableSpan``, or encoded bytes);
        ``batch`` wraps a list of converted spans into one ``export()`` argument; ``convert_kept`` converts
        a step's spans with the span budget's tracestate (:meth:`offer_steps`' ``decisions``)."""
        self._convert_kept = convert_kept
        self._exporter = exporter
        self._batch = batch
        self._protocol = protocol or ("grpc" if "grpc" in type(exporter).__module__ else "http/protobuf")
        self._convert = convert
        self._sampler = sampler
        self._always_on = sampler is ALWAYS_ON  # its decision is always "sampled": not asked per step
        self._endpoint = endpoint
        self._on_first_failure = on_first_failure or _warn_stderr
        self._queue: queue.Queue[list[Any] | None] = queue.Queue()
        self._queued = 0
        self._in_flight = 0
        """Spans of the batch the exporter is sending now (counted by its outcome, even after close)."""
        self._closed = False
        self._finished = False
        self._lock = threading.Lock()
        self.counts = ExportCounts()
        self.last_export_failed = False
        self._thread = threading.Thread(target=self._run, name="traceml-otlp", daemon=True)
        self._thread.start()

    def offer(self, step_spans: Sequence[SpanData]) -> bool:
        """Queue one step's spans (root first) if the sampler keeps its trace.

        Returns whether the sampler kept it (exemplars then point at a trace that is sent).
        """
        return self.offer_steps([step_spans])[0]

    def offer_steps(self, steps: Sequence[Sequence[SpanData] | EncodedStep],
                    decisions: Sequence[Kept | None] | None = None) -> list[bool]:
        """Queue several steps' spans (each root first) at once: one queue hand-off, not one per step.

        A step is its span objects, or an :class:`EncodedStep` (its spans encoded already, by the
        encoder ``convert`` and ``convert_kept`` use).
        ``decisions`` (the span budget's, one per step): ``None`` drops the step (counted as
        ``budget_dropped``), a :class:`Kept` with a tracestate has its spans converted with it.
        Returns, per step, whether it is sent (the budget and the sampler kept it). Steps that do not
        fit in the queue are counted as ``queue_full``. If converting a span raises, nothing of the
        batch was counted or queued.
        """
        kept: list[bool] = []
        accepted: list[tuple[Sequence[SpanData] | EncodedStep, Kept | None]] = []
        sampled_out = queue_full = budget_dropped = 0
        with self._lock:
            room = MAX_QUEUED_SPANS - self._queued
        for index, step_spans in enumerate(steps):
            if not step_spans:
                kept.append(False)
                continue
            decision = None
            if decisions is not None:
                decision = decisions[index]
                if decision is None:
                    budget_dropped += len(step_spans)
                    kept.append(False)
                    continue
            if not (self._always_on or self._sampled(step_spans)):
                sampled_out += len(step_spans)
                kept.append(False)
                continue
            kept.append(True)
            if len(step_spans) > room:
                queue_full += len(step_spans)
                continue
            room -= len(step_spans)
            accepted.append((step_spans, decision))
        convert, convert_kept = self._convert, self._convert_kept
        converted: list[Any] = []
        for step_spans, decision in accepted:  # may raise
            if decision is not None and decision.trace_state and convert_kept is not None:
                converted.extend(convert_kept(step_spans, decision))
            elif type(step_spans) is EncodedStep:
                converted.extend(step_spans.encoded)
            else:
                converted.extend([convert(span) for span in step_spans])  # type: ignore[union-attr]
        with self._lock:
            self.counts.sampled_out += sampled_out
            self.counts.budget_dropped += budget_dropped
            self.counts.queue_full += queue_full
            self._queued += len(converted)
        if converted:
            self._queue.put(converted)
        return kept

    def _sampled(self, step: Sequence[SpanData] | EncodedStep) -> bool:
        """Whether ``OTEL_TRACES_SAMPLER`` keeps the step's trace (its root span's)."""
        if type(step) is EncodedStep:
            trace_id, name = step.trace_id, SPAN_STEP
        else:
            trace_id, name = step[0].trace_id, step[0].name  # type: ignore[index]
        return self._sampler.should_sample(None, trace_id, name).decision.is_sampled()

    @property
    def protocol(self) -> str:
        """``grpc`` or ``http/protobuf``."""
        return self._protocol

    def failing_cause(self) -> str | None:
        """Why export is failing, when it is: the last attempt failed, or the one in flight has already
        logged an error (the SDK retries it with back-off until its timeout, 10 s by default)."""
        if self.last_export_failed:
            return self.counts.last_error
        ident = self._thread.ident
        messages = install_log_recorder().peek(ident) if ident is not None and self._in_flight else []
        return failure_cause(messages, self._protocol, self._endpoint) if messages else None

    def close(self, timeout_s: float, in_flight_grace_s: float = 0.0) -> ExportCounts:
        """Send what is queued until ``timeout_s``; count the rest as not sent.

        A batch already handed to the exporter at the deadline is waited for up to
        ``in_flight_grace_s`` more: the collector may accept it (then it is delivered, not lost).
        The exporter is shut down after the wait, which also ends an export still retrying.
        """
        self._queue.put(None)
        self._thread.join(timeout_s)
        with self._lock:  # what never left the queue counts as not sent, once
            self._closed = True
            self.counts.not_sent_at_shutdown += self._queued - self._in_flight
            self._queued = self._in_flight
        if self._in_flight:
            self._thread.join(in_flight_grace_s)
        with self._lock:  # a batch still in flight after the grace: not sent (its late answer is ignored)
            self.counts.not_sent_at_shutdown += self._queued
            self._queued = self._in_flight = 0
            self._finished = True
        try:
            self._exporter.shutdown()
        except Exception:
            pass
        return self.counts

    def _run(self) -> None:
        batch: list[Any] = []
        size = 0
        deadline = time.monotonic() + BATCH_DELAY_S
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = []
            if item is None or self._closed:
                self._send(batch)
                return
            batch.extend(item)
            if item and type(item[0]) is bytes:  # encoded spans (the emitter's): their size counts too
                size += sum(map(len, item))
            if len(batch) >= MAX_BATCH_SPANS or size >= MAX_BATCH_BYTES or time.monotonic() >= deadline:
                self._send(batch)
                batch = []
                size = 0
                deadline = time.monotonic() + BATCH_DELAY_S

    def _send(self, batch: list[Any]) -> None:
        with self._lock:
            if not batch or self._closed:
                return
            self._in_flight = len(batch)
        logs = install_log_recorder()
        logs.take()  # forget what earlier batches logged
        try:
            result = self._exporter.export(self._batch(batch))
            error = None if result == SpanExportResult.SUCCESS else failure_cause(logs.take(), self._protocol,
                                                                                     self._endpoint)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            if self._finished:  # close() already counted this batch as not sent
                return
            self._in_flight = 0
            self._queued -= len(batch)
            self.last_export_failed = error is not None
            if error is None:
                self.counts.exported += len(batch)
                return
            first = self.counts.failed == 0
            self.counts.failed += len(batch)
            self.counts.last_error = error
        if first:
            self._on_first_failure(
                f"OTLP span export ({self._protocol}) to {self._endpoint} is failing: {error}; spans that "
                "cannot be delivered are counted (traceml_export_dropped_spans_total) and reported at the "
                "end; the local copy is unaffected"
            )


def _warn_stderr(message: str) -> None:
    print(f"traceml: {message}", file=sys.stderr, flush=True)
