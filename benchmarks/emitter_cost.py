"""CPU the emitter process spends per step, stage by stage: the cost that competes with training.

    .venv/bin/python benchmarks/emitter_cost.py            # stage table + whole emitter, local copy only
    .venv/bin/python benchmarks/emitter_cost.py --otlp     # also OTLP spans + metrics to a real rotel
    .venv/bin/python benchmarks/emitter_cost.py --otlp --otlp-spans sampled --sample-rate 0.1
                                                           # + the whole emitter under the span budget
    .venv/bin/python benchmarks/emitter_cost.py --otlp --otlp-spans all --collectives 2
                                                           # a DDP rank's steps: 2 gradient buckets each

One synthetic stream of 1 ms steps (a step, forward, backward and optimizer span, an input wait,
CUDA peaks, the phase calls unnumbered as the training thread sends them; in frames of 64 steps; with
``--collectives N``, N DDP gradient buckets' all_reduce calls inside backward, as a DDP rank's capture
side sends them, which add one collective span per step) goes
through each stage of
the real emitter code in this process, and each stage's process CPU time (``time.process_time``:
all threads, so an exporter's own thread counts) is divided by the steps:

- frame decode: bytes to frame dicts (``FrameBuffer``);
- record building: rows to ``StepRecord`` (``decode_step``);
- span building: records to ``StepSpans`` (``StepSpanBuilder``);
- OTLP encode + export: the span shipper with the SDK's gRPC exporter to rotel (blackhole);
- local copy + table, one pass: what the default emitter (no OTLP endpoint, no metrics) does instead
  of record building and the stages after it, step rows straight to the local copy's JSON and the
  table's rows (``StepLines``; not in the sum of stages);
- one pass + records + OTLP pb: with OTLP export on, what replaces record building, span building and
  OTLP encoding for steps of a templated shape (:mod:`traceml_otel.emit.step_protobuf`): the one
  pass's text, each step's ``StepRecord`` and its spans' protobuf by templates, without span objects
  (not in the sum of stages; the next two rows are the reference path it replaces);
- local-copy encode + write: OTLP JSON Lines to a file (``LocalCopyWriter``);
- step table encode + write: its CSV rows (``StepTable``), written beside the local copy by default;
- metrics update + export: ``StepMetrics.record`` per step and the OTLP metric export at the end.

Then the whole ``Emitter`` (what the worker runs) on the same stream, local copy only and, with
``--otlp``, with OTLP spans and metrics, as a check that the stages add up. CPU time, unlike wall
time, is stable on these noisy VMs; the ratio line compares with a bare loop over the same rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import _start_rotel

from traceml_otel.emit.worker import Emitter
from traceml_otel.wire import frames
from traceml_otel.wire.frames import FrameBuffer, encode_frame
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.step_row import CollectiveRow, PhaseRow, StepRow, decode_step

STEPS = 4000
BATCH = 64
MS = 1_000_000
SPANS_PER_STEP = 4
COLLECTIVES = 0
"""DDP gradient buckets per step (``--collectives``): all_reduce calls handed over during backward."""


def _collectives(start: int, step: int) -> list[CollectiveRow]:
    """``COLLECTIVES`` DDP buckets as a CPU rank's capture side sends them: handed over in backward
    (350-850 us into the step), spread evenly, each completing 60-80 us later (the time after the
    last hand-over is exposed), 25 MB each (DDP's default bucket)."""
    calls = []
    for k in range(COLLECTIVES):
        handed = start + 350_000 + (k + 1) * 500_000 // (COLLECTIVES + 1)
        call = CollectiveRow.started(kind="all_reduce", source="ddp", start_ns=handed, nbytes=25 << 20,
                                     blocking=False)
        call.end_ns = handed + 60_000 + (step * 7919 + k * 104_729) % 20_000  # varying completions
        calls.append(call)
    return calls


def _rows(first: int, count: int) -> list[StepRow]:
    rows = []
    for step in range(first, first + count):
        start = step * MS
        phases = [PhaseRow.timed("forward", None, start + 50_000, start + 350_000, None),
                  PhaseRow.timed("backward", None, start + 350_000, start + 850_000, None),
                  PhaseRow.timed("optimizer", None, start + 860_000, start + 950_000, None)]
        rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + 990_000,
                               input_wait_ns=40_000, input_fetches=1, optimizer_steps=1,
                               peak_allocated_bytes=1 << 30, peak_reserved_bytes=2 << 30,
                               phases=phases, collectives=_collectives(start, step)))
    return rows


def stream() -> bytes:
    """The synthetic step stream as the trainer writes it into the pipe (frames of ``BATCH`` steps)."""
    encode = getattr(frames, "encode_steps", None)  # the trainer's own encoder (orjson), where it exists
    if encode is None:
        return b"".join(encode_frame({"t": "steps", "s": _rows(first, min(BATCH, STEPS - first))})
                        for first in range(0, STEPS, BATCH))
    return b"".join(encode(_rows(first, min(BATCH, STEPS - first))) for first in range(0, STEPS, BATCH))


SPANS_MODE: dict[str, object] = {}
"""``otlp_spans`` and ``otlp_sample_rate`` for the hello (``--otlp-spans``, ``--sample-rate``)."""


def _hello(run_dir: str | None, traces: str | None = None, metrics: bool = False) -> Hello:
    return Hello(run_id="bench", rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                 anchor_ns=time.time_ns(), shutdown_timeout_s=30.0, service_name="bench",
                 run_dir=run_dir, traces_endpoint=traces, traces_protocol="grpc" if traces else None,
                 metrics_endpoint=traces if metrics else None,
                 metrics_protocol="grpc" if metrics and traces else None, sampler="always_on",
                 **SPANS_MODE)  # type: ignore[arg-type]


def _per_step(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) / STEPS * 1e6


def stage_table(endpoint: str | None) -> list[tuple[str, float]]:
    """Each stage on the output of the one before (so each is timed alone on the same stream)."""
    data = stream()
    table: list[tuple[str, float]] = []
    frames: list[dict] = []

    def decode_frames() -> None:
        buffer = FrameBuffer()
        buffer.feed(data)
        while (frame := buffer.next_frame()) is not None:
            frames.append(frame)

    table.append(("frame decode", _per_step(decode_frames)))
    anchor = time.time_ns()
    batches: list[list] = []
    table.append(("record building", _per_step(
        lambda: batches.extend([decode_step(row, anchor) for row in frame["s"]] for frame in frames))))
    with tempfile.TemporaryDirectory() as run_dir:
        default = Emitter(_hello(run_dir))  # local copy and step table only: no span objects needed
        lines = getattr(default, "lines", None)  # absent before the one-pass encoder
        if lines is not None:
            def one_pass() -> None:
                for frame in frames:
                    encoded = lines.encode(frame["s"], anchor)
                    steps = getattr(encoded, "steps", None)  # absent before the encoding by runs
                    if steps is None:
                        default.local.write_encoded(encoded.spans_json, encoded.spans)
                        default.table.write_lines(encoded.rows)
                        continue
                    default.local.write_encoded(encoded.spans_json, encoded.spans, steps)
                    default.table.write_lines(encoded.rows, steps)

            table.append(("local copy + table, one pass", _per_step(one_pass)))
            assert default.local.steps_written == STEPS
            if not COLLECTIVES:  # steps with collectives may take the reference path
                assert lines.reference_steps == 2  # the first step, then the first of its shape
        default.finish("ok", 0, True)
    with tempfile.TemporaryDirectory() as run_dir:
        emitter = Emitter(_hello(run_dir, endpoint, metrics=endpoint is not None))
        otlp_lines = getattr(emitter.lines, "otlp", None)  # absent before the OTLP templates
        if endpoint is not None and otlp_lines is not None:
            def templated() -> None:  # nothing kept (a list of them would slow the stages after by GC)
                for frame in frames:
                    emitter.lines.encode(frame["s"], anchor, keep_spans=True)

            table.append(("one pass + records + OTLP pb", _per_step(templated)))
        built: list[list] = []
        table.append(("span building", _per_step(
            lambda: built.extend([emitter.builder.build(record) for record in batch] for batch in batches))))
        if emitter.shipper is not None:
            shipper = emitter.shipper

            def ship() -> None:
                offer_steps = getattr(shipper, "offer_steps", None)  # absent before the batch offer
                for batch in built:
                    if offer_steps is not None:
                        offer_steps([spans.all() for spans in batch])
                        continue
                    for spans in batch:
                        shipper.offer(spans.all())
                counts = shipper.close(60.0)
                assert counts.exported == STEPS * SPANS_PER_STEP, counts

            table.append(("OTLP encode + export (gRPC)", _per_step(ship)))
            emitter.shipper = None
        local = emitter.local
        assert local is not None
        table.append(("local-copy encode + write", _per_step(
            lambda: [local.write([span for step in batch for span in step.all()], steps=len(batch))
                     for batch in built])))
        assert local.steps_written == STEPS
        steps_table = emitter.table
        if steps_table is not None:
            table.append(("step table encode + write", _per_step(
                lambda: [steps_table.write(batch) for batch in built])))
        if emitter.metrics is not None and endpoint is not None:
            metrics = emitter.metrics

            def record_metrics() -> None:
                batch_api = getattr(metrics, "record_batch", None)  # absent before the batch counters
                for records, steps in zip(batches, built, strict=True):
                    if batch_api is not None:
                        batch_api([(r, spans, True) for r, spans in zip(records, steps, strict=True)])
                        continue
                    for record, spans in zip(records, steps, strict=True):
                        metrics.record(record, spans)
                metrics.shutdown(30.0)  # the final export: the same work as each periodic one

            table.append(("metrics update + export", _per_step(record_metrics)))
            emitter.metrics = None
        emitter.finish("ok", 0, True)
    return table


def whole_emitter(endpoint: str | None) -> float:
    """The worker's own loop on the same stream: frames in, every output, shutdown drain included."""
    data = stream()
    with tempfile.TemporaryDirectory() as run_dir:
        emitter = Emitter(_hello(run_dir, endpoint, metrics=endpoint is not None))

        def run() -> None:
            buffer = FrameBuffer()
            buffer.feed(data)
            while (frame := buffer.next_frame()) is not None:
                emitter.handle_steps(frame["s"])
                while emitter.has_export_work:
                    emitter.export_next()
            emitter.finish("ok", 0, True)

        per_step = _per_step(run)
        assert emitter.stats.spans_local == STEPS * SPANS_PER_STEP
        if endpoint:
            stats = emitter.stats
            assert stats.otlp_exported + stats.otlp_budget_dropped == STEPS * SPANS_PER_STEP, stats
            if stats.otlp_budget_dropped:
                total = STEPS * SPANS_PER_STEP
                print(f"{'  (span budget: sent':<32} {stats.otlp_exported:8d} of {total} spans)")
        return per_step


def bare_loop() -> float:
    """A bare loop over the same rows (the floor any per-step work sits on)."""
    rows = [row for first in range(0, STEPS, BATCH) for row in _rows(first, min(BATCH, STEPS - first))]
    return _per_step(lambda: [row[0] for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--otlp", action="store_true", help="also export to a real rotel collector")
    parser.add_argument("--otlp-spans", default="auto", choices=("auto", "all", "sampled"),
                        help="the span budget's mode (TRACEML_OTLP_SPANS) for the whole-emitter rows")
    parser.add_argument("--sample-rate", type=float, default=None, help="TRACEML_OTLP_SAMPLE_RATE")
    parser.add_argument("--collectives", type=int, default=0, metavar="N",
                        help="DDP gradient buckets (all_reduce calls) per step: a DDP rank's steps")
    args = parser.parse_args()
    global COLLECTIVES, SPANS_PER_STEP
    COLLECTIVES = max(0, args.collectives)
    SPANS_PER_STEP = 4 + (1 if COLLECTIVES else 0)  # the buckets' one collective span (per source, kind)
    rotel = endpoint = None
    if args.otlp:
        rotel, endpoint = _start_rotel()
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # the SDK exporters read it, as in the emitter
    try:
        print(f"{STEPS} steps, {SPANS_PER_STEP} spans each ({COLLECTIVES} DDP buckets), frames of {BATCH}; "
              f"load average "
              f"{os.getloadavg()[0]:.1f}")
        print(f"{'stage':<32} us CPU/step")
        table = stage_table(endpoint)
        for name, cost in table:
            print(f"{name:<32} {cost:8.1f}")
        print(f"{'sum of stages':<32} {sum(cost for name, cost in table if 'one pass' not in name):8.1f}"
              "   (the reference path: span objects, then OTLP encoding)")
        bare = bare_loop()
        whole = whole_emitter(None)
        print(f"{'whole emitter, local copy only':<32} {whole:8.1f}   (bare loop {bare:.2f}, "
              f"ratio {whole / max(bare, 1e-3):.0f}x)")
        if endpoint is not None:
            print(f"{'whole emitter, + OTLP + metrics':<32} {whole_emitter(endpoint):8.1f}")
            if args.otlp_spans != "auto" or args.sample_rate is not None:
                SPANS_MODE.update(otlp_spans=args.otlp_spans, otlp_sample_rate=args.sample_rate)
                label = f"  same, {args.otlp_spans} {args.sample_rate or ''}".rstrip()
                print(f"{label:<32} {whole_emitter(endpoint):8.1f}")
    finally:
        if rotel is not None:
            rotel.kill()


if __name__ == "__main__":
    main()
