"""``manifest.json``: what launched the run, when, on how many ranks, and how it ended.

One record, one writer, one reader. ``traceml run`` writes it around the run; without it rank 0
of a direct launch (``python``, ``torchrun``, ``accelerate launch``) writes it at ``init()`` and
completes it at shutdown; synthetic test runs write it too. The analyzer reads it.

The file carries ``manifest_version``. A file without one was written before the field existed
and reads as version 1. A newer version is read field by field as far as this version knows
them, with a note that fields may be missing; a corrupt file is a problem to report, never a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.contract import MANIFEST_FILE
from traceml_otel.wire._json import (
    RecordError,
    as_float,
    as_int,
    as_str,
    as_version,
    ensure_run_dir,
    read_json_object,
)
from traceml_otel.wire._json import write_atomically as _write_atomically

MANIFEST_VERSION = 1
"""The version this code writes and fully reads."""

END_STATUS_RUNNING = "running"


@dataclass(frozen=True, slots=True)
class Manifest:
    """One run's ``manifest.json``.

    ``command`` and ``launcher`` are argument lists with secret-looking values already redacted
    by the writer (``traceml_otel.sanitize.redact_argv``). ``launcher`` is the launching command
    (``traceml run``: the ``torch.distributed.run`` or Python command line; a direct launch: its
    launcher's name). ``exit_code`` is ``None`` while running, and for a direct launch that ended
    without an uncaught exception (a process cannot see its own exit code).
    """

    run_id: str
    run_name: str = ""
    command: tuple[str, ...] = ()
    launcher: tuple[str, ...] = ()
    world_size: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    end_status: str = END_STATUS_RUNNING
    nnodes: int | None = None
    node_rank: int | None = None
    written_by: str | None = None
    """``"rank 0"`` for a direct launch; ``None`` when ``traceml run`` (or a tool) wrote it."""
    exception_type: str | None = None
    """The uncaught exception that ended a direct launch, if any."""
    diagnosis_s: float | None = None
    """Seconds ``traceml run`` spent on its end-of-run diagnosis after the job's end (telemetry's own
    time: the job still held its machines)."""
    first_failure_rank: int | None = None
    """The rank that failed first as ``traceml run`` saw its children (launch/child_watch.py): a rank
    killed by the OS, whose peers' errors are consequences. Written as soon as it is seen."""
    first_failure: str | None = None
    """How that rank ended, as its parent saw it: ``SIGKILL`` or ``exit code N``."""
    version: int = MANIFEST_VERSION


@dataclass(frozen=True, slots=True)
class ManifestRead:
    """What reading a run directory's manifest gave: the record (or ``None``) and any problem with it."""

    manifest: Manifest | None
    problem: str | None = None


def encode_manifest(manifest: Manifest) -> str:
    """The JSON text of ``manifest`` (keys as documented in docs/telemetry.md)."""
    data: dict[str, object] = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": manifest.run_id,
        "run_name": manifest.run_name,
        "command": list(manifest.command),
        "launcher": list(manifest.launcher),
        "world_size": manifest.world_size,
        "start_time": manifest.start_time,
        "end_time": manifest.end_time,
        "exit_code": manifest.exit_code,
        "end_status": manifest.end_status,
    }
    optional = {"nnodes": manifest.nnodes, "node_rank": manifest.node_rank, "written_by": manifest.written_by,
                "exception_type": manifest.exception_type, "diagnosis_s": manifest.diagnosis_s,
                "first_failure_rank": manifest.first_failure_rank, "first_failure": manifest.first_failure}
    data.update({key: value for key, value in optional.items() if value is not None})
    return json.dumps(data, indent=2) + "\n"


def _argv(raw: object) -> tuple[str, ...]:
    if isinstance(raw, list):
        return tuple(str(part)[:4096] for part in raw[:4096])
    if isinstance(raw, str):  # written by hand or by another tool
        return tuple(raw.split())
    return ()


def _seconds(raw: object) -> float | None:
    value = as_float(raw)
    return value if value is not None and 0 <= value < 1e7 else None


def decode_manifest(data: dict[str, object]) -> Manifest:
    """The record in a decoded ``manifest.json``; every field may be missing or malformed (then unset)."""
    return Manifest(
        run_id=as_str(data.get("run_id")) or "",
        run_name=as_str(data.get("run_name")) or "",
        command=_argv(data.get("command")),
        launcher=_argv(data.get("launcher")),
        world_size=as_int(data.get("world_size")),
        start_time=as_float(data.get("start_time")),
        end_time=as_float(data.get("end_time")),
        exit_code=as_int(data.get("exit_code")),
        end_status=as_str(data.get("end_status")) or "",
        nnodes=as_int(data.get("nnodes")),
        node_rank=as_int(data.get("node_rank")),
        written_by=as_str(data.get("written_by")),
        exception_type=as_str(data.get("exception_type"), 200),
        diagnosis_s=_seconds(data.get("diagnosis_s")),
        first_failure_rank=as_int(data.get("first_failure_rank")),
        first_failure=as_str(data.get("first_failure"), 64),
        version=as_version(data.get("manifest_version")) or 1,
    )


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Write ``run_dir/manifest.json`` atomically (the folder is created).

    Raises:
        OSError: the folder is read-only or full; callers that must not fail say so and go on.
    """
    ensure_run_dir(run_dir)
    _write_atomically(run_dir / MANIFEST_FILE, encode_manifest(manifest))


def read_manifest(run_dir: Path) -> ManifestRead:
    """The manifest of ``run_dir``: absent gives no record and no problem; corrupt gives a problem."""
    path = run_dir / MANIFEST_FILE
    if not path.exists() and not path.is_symlink():
        return ManifestRead(None)
    try:
        manifest = decode_manifest(read_json_object(path))
    except RecordError as error:
        return ManifestRead(None, f"manifest ignored: {error}")
    if manifest.version > MANIFEST_VERSION:
        return ManifestRead(manifest, f"{path}: manifest version {manifest.version} is newer than this "
                                      f"traceml-otel reads ({MANIFEST_VERSION}); fields it added are ignored")
    return ManifestRead(manifest)
