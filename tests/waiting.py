"""Waiting for a state instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest


def wait_for(check: Callable[[], object], timeout_s: float, what: str, log: Path | None = None,
             poll_s: float = 0.1) -> None:
    """Return as soon as ``check()`` is true; fail the test with ``what`` (and the tail of ``log``) when it
    is not within ``timeout_s``. An ``OSError`` from ``check`` (a server not up yet) counts as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    tail = f"; log:\n{log.read_text(errors='replace')[-3000:]}" if log is not None and log.exists() else ""
    pytest.fail(f"{what} within {timeout_s} s{tail}")
