"""The alerting metrics over OTLP from a real training process: drops counted while they happen.

Spans go to a dead endpoint (nothing listens), metrics to a real OTLP/HTTP receiver. The
dropped-spans counter must be exported at 0 first and move while the run still goes on,
the end marker must say 1 only in the final export, and the info series and input-wait
histogram must arrive with the contract's names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.otlp_receiver import OtlpHttpReceiver
from tests.integration.otlp_stack import free_port
from tests.waiting import wait_for
from traceml_otel import contract as c
from traceml_otel._version import __version__

STEADY = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "steady_loop.py"


def value(point) -> float:
    return getattr(point, point.WhichOneof("value"))


def points(receiver: OtlpHttpReceiver, name: str) -> list:
    return [
        p
        for m in receiver.metrics()
        if m.metric.name == name
        for p in (m.metric.sum.data_points or m.metric.gauge.data_points or m.metric.histogram.data_points)
    ]


def test_drops_are_exported_while_the_run_goes_on(tmp_path: Path) -> None:
    dead = free_port()
    steps = 150
    with OtlpHttpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
        env.update(
            TRACEML_RUNS_DIR=str(tmp_path),
            TRACEML_RUN_ID="lossy",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{dead}/v1/traces",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"{receiver.endpoint}/v1/metrics",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1",
            OTEL_METRIC_EXPORT_INTERVAL="300",
        )
        process = subprocess.Popen(
            [sys.executable, str(STEADY), "--steps", str(steps), "--sleep", "0.04"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        live_drop = None
        while process.poll() is None:
            dropped = [value(p) for p in points(receiver, c.METRIC_SPANS_DROPPED)]
            if dropped and dropped[-1] > 0 and live_drop is None:
                live_drop = dropped[-1]
            time.sleep(0.1)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        wait_for(lambda: 1 in [value(p) for p in points(receiver, c.METRIC_RUN_ENDED)], 10,
                 "the final export (run ended = 1) did not reach the receiver")

        dropped = [value(p) for p in points(receiver, c.METRIC_SPANS_DROPPED)]
        assert dropped[0] == 0  # present at 0 from the first export
        assert live_drop, "no drop was exported while the trainer still ran"
        stats = json.loads((tmp_path / "lossy" / c.export_stats_file_name(0)).read_text())
        assert (
            stats["otlp_dropped"] > 0 and dropped[-1] == stats["otlp_dropped"]
        )  # final export = final count
        assert dropped == sorted(dropped)  # cumulative

        ended = [value(p) for p in points(receiver, c.METRIC_RUN_ENDED)]
        # 0 while it ran; 1 from the clean end on (exports during the final drain say so too)
        assert ended[0] == 0 and ended[-1] == 1 and ended == sorted(ended)
        (info, *_) = points(receiver, c.METRIC_RANK_INFO)
        attributes = {kv.key: kv.value for kv in info.attributes}
        assert attributes[c.ATTR_RUN_ID].string_value == "lossy" and attributes[c.ATTR_RANK].int_value == 0
        assert attributes[c.ATTR_VERSION].string_value == __version__
        assert attributes[c.ATTR_GPU_UUID].string_value == "" and attributes[c.ATTR_HOST].string_value
        wait = points(receiver, c.METRIC_STEP_INPUT_WAIT)[-1]
        assert wait.count == steps and wait.sum > 0  # every step fetched a batch
        last_step = value(points(receiver, c.METRIC_LAST_STEP_TIMESTAMP)[-1])
        assert time.time() - 60 < last_step <= time.time()
