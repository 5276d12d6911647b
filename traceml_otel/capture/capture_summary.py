"""A capture's summary tables from ``torch.profiler``'s own ``key_averages()`` (no profiler of ours).

Top operators by self time (CPU, and the device when CUDA was profiled), the user-code frames that
called them (with stacks), host-device synchronisations and collectives. Runs on the exporter thread.
HTA (Holistic Trace Analysis) was not used: it reads the exported trace again and needs pandas; what
the report shows needs ``key_averages`` alone.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from traceml_otel.wire.capture_record import MAX_ROWS, OpTime

TOP = 10
SYNC_NAMES = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cudaEventSynchronize", "aten::nonzero", "aten::is_nonzero", "cudaMemcpy", "aten::equal")
"""Operators and runtime calls that make the host wait for the device (``cudaMemcpy``: the blocking one)."""
COLLECTIVE_MARKS = ("c10d::", "nccl:", "gloo:", "record_param_comms", "allreduce", "all_reduce", "all_gather",
                    "allgather", "reduce_scatter", "broadcast", "barrier", "alltoall", "all_to_all")
_NOT_OPS = ("ProfilerStep", "[memory]", "[OutOfMemory]")
_PYTHON_NAME = re.compile(r"^(<built-in |<method |.*\.py\(\d+\): )")


def _self_device(event: Any) -> float:
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0.0)
    return float(value or 0.0)


def _python(event: Any) -> bool:
    return bool(getattr(event, "is_python_function", False)) or _PYTHON_NAME.match(str(event.key)) is not None


def _library(name: str) -> bool:
    """A Python frame of torch, traceml, an installed package or the standard library."""
    if name.startswith(("<", "torch/", "traceml_otel/")) or "-packages/" in name:  # site-, dist-
        return True
    if "/traceml_otel/" in name or "/torch/" in name:  # an editable install's (or a checkout's) absolute path
        return True
    stem = name.split("(", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return stem in sys.stdlib_module_names


def user_frame(event: Any) -> str:
    """The innermost Python function of user code above ``event`` (``train.py(80): step``: the file, the
    line where that function starts, its name), from the profiler's Python events; ``""``: none."""
    parent = getattr(event, "cpu_parent", None)
    depth = 0
    while parent is not None and depth < 64:
        name = str(parent.name)
        if _python(parent) and not _library(name):
            return name.rsplit("/", 1)[-1][:200]
        parent, depth = parent.cpu_parent, depth + 1
    return ""


def summarize(profiler: Any, with_stack: bool) -> dict[str, tuple[OpTime, ...]]:
    """``top_cpu``, ``top_device``, ``frames``, ``syncs`` and ``collectives`` of a stopped profiler."""
    flat = [e for e in profiler.key_averages() if not str(e.key).startswith(_NOT_OPS) and not _python(e)]
    cpu_total = sum(max(0.0, float(e.self_cpu_time_total)) for e in flat) or 1.0
    device_total = sum(_self_device(e) for e in flat) or 1.0
    op_frames: dict[tuple[str, str], float] = {}  # (op, frame) -> self CPU us
    frame_time: dict[str, list[float]] = {}
    if with_stack:
        try:
            for event in profiler.events():
                if _python(event) or str(event.name).startswith(_NOT_OPS):
                    continue
                frame = user_frame(event)
                if not frame:
                    continue
                own = float(event.self_cpu_time_total)
                op_frames[event.name, frame] = op_frames.get((event.name, frame), 0.0) + own
                totals = frame_time.setdefault(frame, [0.0, 0])
                totals[0] += own
                totals[1] += 1
        except Exception:  # stacks are a help, never a reason to lose the summary
            op_frames, frame_time = {}, {}
    frames_of: dict[str, str] = {}
    best: dict[str, float] = {}
    for (name, frame), own in op_frames.items():
        if own >= best.get(name, -1.0):
            frames_of[name], best[name] = frame, own

    def op(event: Any, share_of: float, device: bool = False) -> OpTime:
        key = str(event.key)
        own = _self_device(event) if device else float(event.self_cpu_time_total)
        return OpTime(name=key[:200], self_cpu_us=round(float(event.self_cpu_time_total), 1),
                      self_device_us=round(_self_device(event), 1), count=int(event.count),
                      share=round(own / share_of, 4), frame=frames_of.get(key, ""))

    by_cpu = sorted(flat, key=lambda e: float(e.self_cpu_time_total), reverse=True)
    by_device = sorted((e for e in flat if _self_device(e) > 0), key=_self_device, reverse=True)
    syncs = [e for e in by_cpu if str(e.key) in SYNC_NAMES]
    collectives = [e for e in by_cpu if any(mark in str(e.key).lower() for mark in COLLECTIVE_MARKS)]
    frame_rows = []
    for frame, (own, count) in sorted(frame_time.items(), key=lambda ft: ft[1][0], reverse=True)[:TOP]:
        top_op = max(((n, t) for (n, f), t in op_frames.items() if f == frame), key=lambda nt: nt[1])[0]
        frame_rows.append(OpTime(name=frame, self_cpu_us=round(own, 1), count=int(count),
                                 share=round(own / cpu_total, 4), frame=top_op[:200]))
    return {
        "top_cpu": tuple(op(e, cpu_total) for e in by_cpu[:TOP]),
        "top_device": tuple(op(e, device_total, device=True) for e in by_device[:TOP]),
        "frames": tuple(frame_rows[:MAX_ROWS]),
        "syncs": tuple(op(e, cpu_total) for e in syncs[:TOP]),
        "collectives": tuple(op(e, cpu_total) for e in collectives[:TOP]),
    }
