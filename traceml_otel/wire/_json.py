"""Bounded, crash-free reading of one small JSON record file, and its atomic, link-refusing write."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from traceml_otel.errors import TracemlError
from traceml_otel.wire.bounded_file import RefusedFile, read_bounded

MAX_RECORD_BYTES = 1 << 20
"""A record file larger than this is not read (they are a few KiB)."""


class RecordError(TracemlError, ValueError):
    """A record file is unreadable, corrupt, or not the record it should be (the message says which)."""


def read_json_object(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``; raises :class:`RecordError` (never anything else) when it is not one."""
    try:
        data = read_bounded(path, max_bytes, follow_links=False)
    except RefusedFile as error:
        raise RecordError(str(error)) from None
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise RecordError(f"{path}: not valid JSON ({type(error).__name__})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{path}: not a JSON object")
    return value


def refuse_link(path: Path) -> None:
    """Raise ``OSError`` (ELOOP) when a symbolic link sits at ``path`` (planted?): never followed."""
    if path.is_symlink():
        raise OSError(errno.ELOOP, f"{path} is a symbolic link; not followed (planted?)")


def ensure_run_dir(run_dir: Path) -> None:
    """Create the run folder (and its parents); a symbolic link planted at the folder itself is refused.

    Raises:
        OSError: it cannot be created, or is a link or not a directory.
    """
    refuse_link(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    refuse_link(run_dir)  # planted between the check and mkdir
    if not run_dir.is_dir():
        raise OSError(errno.ENOTDIR, f"{run_dir} is not a directory")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file; never follows a link planted there.

    Raises:
        OSError: the folder is read-only or full, or a link sits at ``path`` or the temporary path.
    """
    refuse_link(path)
    temporary = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temporary, flags, 0o644)
        try:
            view = memoryview(text.encode("utf-8"))
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def as_int(raw: object) -> int | None:
    """A JSON integer, or ``None`` (booleans, fractions, ``1e400`` and non-numbers are not integers).

    Stricter than ``analyze.otlp_decode.as_int``: a record field written as a string is malformed here,
    where OTLP JSON writes 64-bit integers as strings.
    """
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None


def as_float(raw: object) -> float | None:
    """A finite JSON number, or ``None``."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    try:
        number = float(raw)
    except OverflowError:  # an integer beyond a double
        return None
    return number if number == number and abs(number) != float("inf") else None


def as_str(raw: object, limit: int = 4096) -> str | None:
    """A JSON string (cut at ``limit`` characters), or ``None``."""
    return raw[:limit] if isinstance(raw, str) else None


def as_version(raw: object) -> int | None:
    """A record's version field: a positive integer, or ``None`` when absent or malformed."""
    version = as_int(raw)
    return version if version is not None and version > 0 else None
