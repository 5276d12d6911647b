"""The missing-tool rule: a test needing a tool that setup installs skips on a developer's machine and
fails in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_NEEDS_ABSENT_TOOL = '''
from tests.tools import import_or_missing, requires_tool

@requires_tool("traceml-no-such-tool")
def test_tool():
    pass

def test_package():
    import_or_missing("traceml_no_such_package")
'''


@pytest.mark.parametrize(("ci", "outcome"), [("", "2 skipped"), ("true", "1 failed, 1 error")])
def test_a_missing_tool_skips_here_and_fails_in_ci(tmp_path: Path, ci: str, outcome: str) -> None:
    probe = REPO / "tests" / f"test_probe_missing_tool_{ci or 'dev'}.py"
    probe.write_text(_NEEDS_ABSENT_TOOL)
    try:
        command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                   str(probe)]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                                env={"PATH": "/usr/bin:/bin", "CI": ci})
    finally:
        probe.unlink()
    assert outcome in result.stdout and result.returncode == (1 if ci else 0), result.stdout + result.stderr
    if ci:  # a missing tool fails the test's set-up (an error), a missing package the test
        assert "CI's setup installs it, so its tests may not skip" in result.stdout
