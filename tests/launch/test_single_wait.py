"""The one-process launcher's wait: it sleeps until the child exits (a pidfd on Linux), and its
fallback (``Popen.wait`` with a timeout) gives the same answers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from traceml_otel.launch.single import _exit_within, _pidfd


@pytest.mark.parametrize("use_pidfd", [True, False])
def test_the_wait_returns_the_exit_code_when_the_child_ends_and_none_before(use_pidfd: bool) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.6); sys.exit(3)"])
    pidfd = _pidfd(child.pid) if use_pidfd else None
    if use_pidfd and pidfd is None and sys.platform.startswith("linux"):
        pytest.fail("no pidfd on Linux: the launcher would poll ~55 times a second")
    try:
        assert _exit_within(child, pidfd, 0.05) is None  # still running
        started = time.monotonic()
        code = None
        while code is None and time.monotonic() - started < 30:
            code = _exit_within(child, pidfd, 1.0)
        assert code == 3
    finally:
        if pidfd is not None:
            os.close(pidfd)
        child.kill()
        child.wait()
