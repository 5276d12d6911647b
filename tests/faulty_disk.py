"""Directories where writes fail, for fault tests: a read-only one and a tiny full one.

Both are real: a read-only directory (``chmod`` for a normal user; root ignores modes, so for root
a read-only tmpfs mount), and a tmpfs of a few pages that fills up (ENOSPC from the kernel).
Mounting needs root with CAP_SYS_ADMIN; where it is refused, the test is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode})")


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """``path`` as a directory nobody can write into."""
    if os.geteuid() != 0:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    _mount_tmpfs(path, "ro,size=64k")
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def tiny_disk(path: Path, size: str = "256k") -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` that a long run fills up."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    _mount_tmpfs(path, f"size={size}")
    try:
        yield path
    finally:
        _unmount(path)
