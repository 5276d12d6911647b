"""The emitter process: one per rank, fed step batches through its stdin pipe.

It turns records into spans, appends them to the local copy first (nothing is dropped
there), then offers them to OTLP export and records metrics. It ignores SIGINT and
SIGTERM, so a Ctrl-C or a launcher's SIGTERM reaches the trainer, whose flush arrives
here; it stops at end of stream, which also comes when the trainer is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel import contract as c
from traceml_otel._version import __version__
from traceml_otel.emit.local_copy import LocalCopyWriter
from traceml_otel.emit.metrics import PrometheusEndpoint, RankLabels, StepMetrics
from traceml_otel.emit.otlp import (
    OtlpSpanShipper,
    make_span_exporter,
    quiet_sdk_exporter_logs,
    sampler_from_settings,
)
from traceml_otel.emit.spans import RankInfo, ReadableSpanFactory, StepSpanBuilder
from traceml_otel.emit.wire import WireError, decode_step, read_frames

SHUTDOWN_DRAIN_S = 8.0
EMITTER_NICENESS = 10


@dataclass(slots=True)
class ExportStats:
    """What this rank's emitter did; written to ``rank-<R>.export.json``."""

    run_id: str
    rank: int
    steps_received: int = 0
    spans_local: int = 0
    capture_dropped_steps: int = 0
    otlp_endpoint: str | None = None
    otlp_exported: int = 0
    otlp_sampled_out: int = 0
    otlp_dropped: int = 0
    otlp_drop_reasons: dict[str, int] = field(default_factory=dict)
    otlp_last_error: str | None = None
    clean_shutdown: bool = False
    end_status: str = "running"
    problems: list[str] = field(default_factory=list)


def build_resource(hello: dict[str, Any]) -> Resource:
    """Our resource attributes, merged under ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``."""
    attributes: dict[str, Any] = {
        "service.instance.id": f"{hello['run_id']}/rank-{hello['rank']}",
        "host.name": hello["host"],
        "process.pid": hello["pid"],
        c.ATTR_RUN_ID: hello["run_id"],
    }
    if hello.get("service_name"):
        attributes["service.name"] = hello["service_name"]
    # Resource.create merges the env detector (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) under ours;
    # service.name is only ours when the env named none. A provider the program set up wins over both.
    resource = Resource.create(attributes)
    user = hello.get("user_resource") or {}
    if user:
        resource = resource.merge(Resource({**user, c.ATTR_RUN_ID: hello["run_id"]}))
    return resource


class Emitter:
    """Spans, local copy, OTLP and metrics for one rank."""

    def __init__(self, hello: dict[str, Any]) -> None:
        self.anchor_ns = int(hello["anchor_ns"])
        rank = RankInfo(
            run_id=hello["run_id"], rank=hello["rank"], local_rank=hello["local_rank"],
            world_size=hello["world_size"], node_rank=hello["node_rank"], host=hello["host"],
            cpus=hello.get("cpus"),
        )
        resource = build_resource(hello)
        scope = InstrumentationScope(c.INSTRUMENTATION_SCOPE, __version__)
        self.builder = StepSpanBuilder(rank)
        self.stats = ExportStats(run_id=rank.run_id, rank=rank.rank)
        self.stats_path: Path | None = None
        self.local: LocalCopyWriter | None = None
        if hello.get("run_dir"):
            run_dir = Path(hello["run_dir"])
            self.local = LocalCopyWriter(run_dir / c.traces_file_name(rank.rank), resource, scope)
            self.stats_path = run_dir / c.export_stats_file_name(rank.rank)
        quiet_sdk_exporter_logs()
        self.shipper: OtlpSpanShipper | None = None
        if hello.get("traces"):
            endpoint, protocol = hello["traces"]
            self.stats.otlp_endpoint = endpoint
            self.shipper = OtlpSpanShipper(
                make_span_exporter(protocol),
                sampler_from_settings(hello["sampler"], hello.get("sampler_arg")),
                endpoint,
                ReadableSpanFactory(resource, scope).convert,
                protocol=protocol,
            )
        metrics_protocol = hello["metrics"][1] if hello.get("metrics") else None
        labels = RankLabels(run_id=rank.run_id, rank=rank.rank, local_rank=rank.local_rank, host=rank.host,
                            version=__version__)
        self.linger_s = float(hello.get("prometheus_linger_s") or 0.0)
        self.metrics = StepMetrics(resource, labels, metrics_protocol, _prometheus_endpoint(hello),
                                   dropped_spans=self._dropped_spans)
        self.write_stats()

    def handle_steps(self, rows: list[Any]) -> None:
        """Build, store and ship one batch of steps."""
        records = [decode_step(row, self.anchor_ns) for row in rows]
        built = [self.builder.build(record) for record in records]
        if self.local is not None:
            self.local.write([span for step in built for span in step.all()])
            self.stats.spans_local = self.local.spans_written
        for record, spans in zip(records, built, strict=False):
            sampled = True
            if self.shipper is not None:
                sampled = self.shipper.offer(spans.all())
            self.metrics.record(record, spans, exemplar=sampled)
        self.stats.steps_received += len(records)

    def finish(self, status: str, capture_dropped: int, clean: bool) -> None:
        """Close the local copy, drain OTLP within the deadline, write the final stats."""
        self.stats.capture_dropped_steps = capture_dropped
        self.stats.clean_shutdown = clean
        self.stats.end_status = status
        if clean:
            self.metrics.mark_ended()
        if self.local is not None:
            self.local.close()
        self.write_stats()
        if self.shipper is not None:
            counts = self.shipper.close(SHUTDOWN_DRAIN_S)
            self.stats.otlp_exported = counts.exported
            self.stats.otlp_sampled_out = counts.sampled_out
            self.stats.otlp_dropped = counts.dropped
            self.stats.otlp_last_error = counts.last_error
            self.stats.otlp_drop_reasons = {
                reason: n for reason, n in (
                    ("export failed", counts.failed), ("queue full", counts.queue_full),
                    ("not sent before shutdown deadline", counts.not_sent_at_shutdown),
                ) if n
            }
            if counts.dropped:
                print(f"traceml: rank {self.stats.rank}: {counts.dropped} span(s) were not delivered over "
                      f"OTLP to {self.stats.otlp_endpoint} ({self.stats.otlp_drop_reasons}); "
                      "the local copy has them", file=sys.stderr, flush=True)
        self.metrics.shutdown(timeout_s=3.0)
        self.write_stats()
        if clean:  # a scrape sees the end marker, so the end is not mistaken for a dead rank
            self.metrics.linger(self.linger_s)

    def _dropped_spans(self) -> int:
        return 0 if self.shipper is None else self.shipper.counts.dropped

    def handle_device(self, frame: dict[str, Any]) -> None:
        """The trainer reported its CUDA device (index, UUID) for the info series."""
        uuid = frame.get("uuid")
        self.metrics.set_device(int(frame["index"]), str(uuid)[:128] if uuid else None)

    def write_stats(self) -> None:
        if self.stats_path is None:
            return
        temporary = self.stats_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self.stats), indent=2))
        os.replace(temporary, self.stats_path)


def _prometheus_endpoint(hello: dict[str, Any]) -> PrometheusEndpoint | None:
    port = hello.get("prometheus_port")
    if port is None:
        return None
    address = hello.get("prometheus_addr") or "127.0.0.1"
    return PrometheusEndpoint(int(port) + int(hello["local_rank"]), address)


def main() -> int:
    """Read frames from stdin until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.nice(EMITTER_NICENESS)  # when a CPU is contended, training goes first
    except OSError:
        pass
    stream = sys.stdin.buffer
    frames = read_frames(stream)
    try:
        hello = next(frames)
    except (StopIteration, WireError, ValueError):
        print("traceml: emitter got no settings; exiting", file=sys.stderr)
        return 1
    emitter = Emitter(hello)
    status, dropped, clean = "trainer exited without shutdown (killed?)", 0, False
    started = time.monotonic()
    try:
        for frame in frames:
            kind = frame["t"]
            if kind == "steps":
                emitter.handle_steps(frame["s"])
            elif kind == "device":
                emitter.handle_device(frame)
            elif kind == "bye":
                status, dropped, clean = frame.get("status", "ok"), int(frame.get("dropped", 0)), True
                break
    except (WireError, ValueError) as error:
        emitter.stats.problems.append(f"stream from trainer broken after {time.monotonic() - started:.1f}s: "
                                      f"{error}")
    emitter.finish(status, dropped, clean)
    return 0


if __name__ == "__main__":
    sys.exit(main())
