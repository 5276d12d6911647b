"""Synthetic runs in the local-copy format, for tests, examples and benchmarks.

Writes exactly what ``docs/telemetry.md`` specifies for the local copy: one OTLP ``TracesData``
per line, hex ids, integer enums, 64-bit integers as strings, attributes as typed values.

Example::

    steps = [SyntheticStep(rank=0, step=n, input_wait=0.02) for n in range(50)]
    write_run(tmp_path / "run-1", "run-1", steps)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from traceml_otel import contract as c

SPAN_KIND_INTERNAL = 1
STATUS_CODE_ERROR = 2


@dataclass(frozen=True, slots=True)
class SyntheticStep:
    """One rank's step to write. Phase times are seconds; ``None`` means no span for that phase.

    ``traced`` defaults to the sum of the phases plus ``residual``. ``gpu=True`` also writes
    every ``*.gpu_duration`` attribute (same values) and marks the step as GPU-timed.
    """

    rank: int
    step: int
    input_wait: float | None = 0.001
    forward: float | None = 0.004
    backward: float | None = 0.008
    optimizer: float | None = 0.001
    h2d: float | None = None
    residual: float = 0.0005
    traced: float | None = None
    forward_calls: int = 1
    prefetch_h2d: float | None = None
    optimizer_steps: int | None = 1
    parallelism: str = "none"
    world_size: int = 1
    gpu: bool = False
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    memory_total: int | None = None
    error: str | None = None
    samples: int | None = None
    tokens: int | None = None
    num_workers: int | None = None
    """With ``num_workers`` set, the step carries DataLoader settings (and ``cpus``)."""
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    batch_size: int | None = None
    cpus: int | None = None

    def traced_time(self) -> float:
        """The step span's duration."""
        if self.traced is not None:
            return self.traced
        phases = (self.forward, self.backward, self.optimizer, self.h2d)
        return sum(p for p in phases if p is not None) + self.residual


def _value(value: object) -> dict[str, object]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(pairs: dict[str, object]) -> list[dict[str, object]]:
    return [{"key": key, "value": _value(value)} for key, value in pairs.items() if value is not None]


def _span(
    name: str,
    trace_id: str,
    span_id: str,
    parent: str,
    start: int,
    seconds: float,
    attrs: dict[str, object],
    error: bool = False,
) -> dict[str, object]:
    span: dict[str, object] = {
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + int(seconds * 1e9)),
        "attributes": _attributes(attrs),
        "status": {"code": STATUS_CODE_ERROR} if error else {},
    }
    return span


def step_spans(run_id: str, step: SyntheticStep, start_ns: int) -> list[dict[str, object]]:
    """The ``traceml.step`` span and its phase children for one synthetic step."""
    trace_id = f"{c.step_trace_id(run_id, step.step):032x}"
    root_id = f"{((step.rank + 1) << 48) | (step.step << 8):016x}"
    common = {c.ATTR_RUN_ID: run_id, c.ATTR_STEP: step.step, c.ATTR_RANK: step.rank}
    gpu = step.gpu
    traced = step.traced_time()
    root_attrs = common | {
        c.ATTR_WORLD_SIZE: step.world_size,
        c.ATTR_LOCAL_RANK: step.rank,
        c.ATTR_NODE_RANK: 0,
        c.ATTR_HOST: "synthetic",
        c.ATTR_PARALLELISM: step.parallelism,
        c.ATTR_CLOCK: "gpu" if gpu else "cpu",
        c.ATTR_STEP_CPU_DURATION: traced,
        c.ATTR_STEP_GPU_DURATION: traced if gpu else None,
        c.ATTR_INPUT_WAIT_CPU: step.input_wait,
        c.ATTR_INPUT_WAIT_GPU: step.input_wait if gpu else None,
        c.ATTR_INPUT_WAIT_FETCHES: None if step.input_wait is None else 1,
        c.ATTR_PREFETCH_H2D_CPU: step.prefetch_h2d,
        c.ATTR_OPTIMIZER_STEPS: step.optimizer_steps,
        c.ATTR_MEM_PEAK_ALLOCATED: step.peak_allocated,
        c.ATTR_MEM_PEAK_RESERVED: step.peak_reserved,
        c.ATTR_MEM_TOTAL: step.memory_total,
        c.ATTR_EXCEPTION_TYPE: step.error,
        c.ATTR_STEP_SAMPLES: step.samples,
        c.ATTR_STEP_TOKENS: step.tokens,
        c.ATTR_HOST_CPUS: step.cpus,
    }
    if step.num_workers is not None:
        root_attrs |= {
            c.ATTR_LOADER_NUM_WORKERS: step.num_workers,
            c.ATTR_LOADER_PIN_MEMORY: step.pin_memory,
            c.ATTR_LOADER_PERSISTENT_WORKERS: step.persistent_workers,
            c.ATTR_LOADER_PREFETCH_FACTOR: step.prefetch_factor,
            c.ATTR_LOADER_BATCH_SIZE: step.batch_size,
        }
    spans = [_span(c.SPAN_STEP, trace_id, root_id, "", start_ns, traced, root_attrs, step.error is not None)]
    cursor = start_ns
    number = 1
    for phase, seconds in zip(c.PHASES, (step.forward, step.backward, step.optimizer, step.h2d), strict=True):
        if seconds is None:
            continue
        calls = step.forward_calls if phase == "forward" else 1
        for call in range(calls):
            part = seconds / calls
            attrs = common | {
                c.ATTR_PHASE_NAME: phase,
                c.ATTR_PHASE_CALL: call,
                c.ATTR_PHASE_CPU_DURATION: part,
                c.ATTR_PHASE_GPU_DURATION: part if gpu else None,
                c.ATTR_H2D_BYTES: 4096 if phase == "h2d" else None,
            }
            span_id = f"{((step.rank + 1) << 48) | (step.step << 8) | number:016x}"
            spans.append(_span(c.PHASE_SPAN_NAMES[phase], trace_id, span_id, root_id, cursor, part, attrs))
            cursor += int(part * 1e9)
            number += 1
    return spans


def traces_data(run_id: str, rank: int, spans: list[dict[str, object]], service: str) -> dict[str, object]:
    """One OTLP ``TracesData`` object holding ``spans`` of one rank."""
    resource = {
        "service.name": service,
        "service.instance.id": f"{run_id}/rank-{rank}",
        "host.name": "synthetic",
        "process.pid": 1000 + rank,
        c.ATTR_RUN_ID: run_id,
    }
    scope = {"name": c.INSTRUMENTATION_SCOPE, "version": "0"}
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [{"scope": scope, "spans": spans}],
            }
        ]
    }


def otlp_lines(
    run_id: str,
    steps: Iterable[SyntheticStep],
    *,
    steps_per_line: int = 8,
    service: str = "traceml-synthetic",
    start_ns: int = 1_700_000_000_000_000_000,
) -> Iterator[tuple[int, str]]:
    """``(rank, line)`` pairs: each line a JSON ``TracesData`` of up to ``steps_per_line`` steps.

    Steps are laid out back to back per rank, each starting after the previous one's traced time
    and the next input wait.
    """
    clocks: dict[int, int] = {}
    pending: dict[int, list[dict[str, object]]] = {}
    counts: dict[int, int] = {}
    for step in steps:
        clock = clocks.get(step.rank, start_ns) + int((step.input_wait or 0.0) * 1e9)
        pending.setdefault(step.rank, []).extend(step_spans(run_id, step, clock))
        clocks[step.rank] = clock + int(step.traced_time() * 1e9)
        counts[step.rank] = counts.get(step.rank, 0) + 1
        if counts[step.rank] % steps_per_line == 0:
            yield (
                step.rank,
                json.dumps(
                    traces_data(run_id, step.rank, pending.pop(step.rank), service), separators=(",", ":")
                ),
            )
    for rank, spans in pending.items():
        if spans:
            yield rank, json.dumps(traces_data(run_id, rank, spans, service), separators=(",", ":"))


def write_run(
    run_dir: Path,
    run_id: str,
    steps: Iterable[SyntheticStep],
    *,
    steps_per_line: int = 8,
    manifest: bool = True,
    service: str = "traceml-synthetic",
) -> Path:
    """Write a local-copy run directory (``rank-<R>.traces.jsonl`` + ``manifest.json``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handles: dict[int, object] = {}
    ranks: set[int] = set()
    try:
        for rank, line in otlp_lines(run_id, steps, steps_per_line=steps_per_line, service=service):
            handle = handles.get(rank)
            if handle is None:
                handle = handles[rank] = (run_dir / c.traces_file_name(rank)).open("w", encoding="utf-8")
            handle.write(line + "\n")  # type: ignore[attr-defined]
            ranks.add(rank)
    finally:
        for handle in handles.values():
            handle.close()  # type: ignore[attr-defined]
    if manifest:
        info = {
            "run_id": run_id,
            "run_name": "synthetic",
            "world_size": max(ranks, default=0) + 1,
            "command": ["python", "synthetic.py"],
            "start_time": 1_700_000_000.0,
            "end_time": 1_700_000_100.0,
            "exit_code": 0,
        }
        (run_dir / c.MANIFEST_FILE).write_text(json.dumps(info), encoding="utf-8")
    return run_dir
