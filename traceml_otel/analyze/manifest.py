"""The run manifest of a local copy (``manifest.json``), read into a typed record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.analyze.otlp import as_float, as_int
from traceml_otel.contract import MANIFEST_FILE
from traceml_otel.sanitize import redact_argv


@dataclass(frozen=True, slots=True)
class RunManifest:
    """What ``traceml run`` recorded about the run; every field may be missing."""

    run_id: str = ""
    run_name: str = ""
    command: str = ""
    world_size: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None


def read_manifest(run_dir: Path) -> RunManifest | None:
    """The manifest of ``run_dir``, or ``None`` if it is absent or unreadable."""
    path = run_dir / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    command = data.get("command", "")
    parts = [str(part) for part in command] if isinstance(command, list) else str(command).split()
    command = " ".join(redact_argv(parts))  # manifests written before redaction, or by other tools
    exit_code = data.get("exit_code", data.get("exit_status"))
    return RunManifest(
        run_id=str(data.get("run_id") or ""),
        run_name=str(data.get("run_name") or ""),
        command=str(command),
        world_size=as_int(data.get("world_size")),
        start_time=as_float(data.get("start_time")),
        end_time=as_float(data.get("end_time")),
        exit_code=as_int(exit_code),
    )
