"""Bounded, crash-free reading of one small JSON record file, and its atomic, link-refusing write."""

from __future__ import annotations

import errno
import json
import math
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
        value = json.loads(data.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as error:
        raise RecordError(f"{path}: bad data: {error} (JSON has no such number)") from None
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise RecordError(f"{path}: not valid JSON ({type(error).__name__})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{path}: not a JSON object")
    return value


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> float:
    """``NaN``, ``Infinity`` and ``-Infinity``, which Python's parser accepts and strict JSON does not."""
    raise _NotFinite(f"a non-finite number ({name})")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400
        raise _NotFinite(f"a number out of range ({text[:40]})")
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


def write_atomically(path: Path, text: str, reserve_bytes: int = 0) -> None:
    """Replace ``path`` with ``text`` through a temporary file; never follows a link planted there.

    ``reserve_bytes``: disk held beyond the new file's end without growing it (``fallocate`` with
    ``KEEP_SIZE``, Linux; nothing elsewhere), so a later in-place overwrite of up to that size needs
    no new blocks on a full disk.

    Raises:
        OSError: the folder is read-only or full, or a link sits at ``path`` or the temporary path.
    """
    refuse_link(path)
    temporary = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temporary, flags, 0o644)
        try:
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if reserve_bytes > len(data):
                _reserve_beyond_end(fd, reserve_bytes)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def _reserve_beyond_end(fd: int, length: int) -> bool:
    """``fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, length)``: disk held for later writes, size unchanged."""
    global _fallocate
    if _fallocate is None:
        try:
            import ctypes
            import ctypes.util

            function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).fallocate
            function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
            _fallocate = function
        except (OSError, AttributeError):
            _fallocate = False
    return bool(_fallocate) and _fallocate(fd, 1, 0, length) == 0  # 1: FALLOC_FL_KEEP_SIZE


_fallocate: Any = None
"""libc's ``fallocate`` once looked up (``False`` where there is none)."""


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
