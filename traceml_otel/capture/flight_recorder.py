"""PyTorch's collective flight recorder, dumped into the run folder when a hang is seen.

When the program enabled it (``TORCH_NCCL_TRACE_BUFFER_SIZE`` or ``TORCH_FR_BUFFER_SIZE`` above 0),
c10d keeps a ring buffer of each process group's recent collectives: sequence ids, op, sizes, state
(scheduled, started, completed). On a hang the watchdog writes it as ``rank-R.flight-recorder.json``
(the JSON form, never the pickled one), so PyTorch's offline tools and people can read it beside
the hang record. The dump goes through one seam, :func:`torch_flight_recorder_json`, so the logic is
tested without a GPU; with gloo on CPU the same torch call works and is tested for real. On CUDA and
NCCL it was not run in this project (no GPU was available); ``benchmarks/gpu_check.py`` checks it
when one is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from traceml_otel.contract import flight_recorder_file_name
from traceml_otel.wire._json import write_atomically

BUFFER_VARIABLES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
MAX_DUMP_BYTES = 64 << 20
"""A larger dump is not written (it is said in the hang record's note instead)."""

Dumper = Callable[[], "bytes | str | None"]


def flight_recorder_enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when the program turned PyTorch's flight recorder on (a buffer size above 0)."""
    env = os.environ if env is None else env
    for name in BUFFER_VARIABLES:
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return True
    return False


def torch_flight_recorder_json() -> bytes | str | None:
    """The flight recorder's JSON dump from c10d (``None`` when this torch build has none)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return None
    return dump(True, False)  # includeCollectives, onlyActive


def dump_flight_recorder(run_dir: Path, rank: int, dumper: Dumper = torch_flight_recorder_json,
                         env: Mapping[str, str] | None = None) -> str:
    """Write ``rank-R.flight-recorder.json`` when enabled; returns what happened, in words (for the note)."""
    if not flight_recorder_enabled(env):
        return ""
    try:
        data = dumper()
    except Exception as error:  # a private torch API: any failure is said, never raised
        return f"flight recorder dump failed ({type(error).__name__}: {str(error)[:120]})"
    if data is None:
        return "flight recorder: nothing to dump (no process group, or this torch has no dump)"
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    if len(text) > MAX_DUMP_BYTES:
        return f"flight recorder dump of {len(text)} bytes not written (over {MAX_DUMP_BYTES})"
    path = Path(run_dir) / flight_recorder_file_name(rank)
    try:
        write_atomically(path, text)
    except OSError as error:
        return f"flight recorder dump not written ({type(error).__name__}: {error})"
    return f"flight recorder in {path.name}"
