"""The analysis-only install: no torch, grpc, prometheus-client or OTel SDK, and the analyzer still works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from traceml_otel.analyze.pipeline import analyze_path

REPO = Path(__file__).resolve().parents[1]
STORED_RUN = REPO / "tests" / "data" / "stored-run"


def test_fresh_venv_without_dependencies_analyzes_a_stored_run() -> None:
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_analysis_install.sh")],
        capture_output=True, text=True, timeout=300, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "primary diagnosis INPUT_BOUND" in result.stdout


def test_a_local_copy_written_under_contract_version_1_still_reads() -> None:
    analysis = analyze_path([STORED_RUN])
    assert analysis.run.run_id == "stored-quickstart" and analysis.run.exit_code == 0
    assert analysis.run.steps_read == 60 and analysis.run.ranks == (0,)
    assert analysis.step.primary.kind == "INPUT_BOUND"
