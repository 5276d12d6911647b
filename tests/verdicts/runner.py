"""Runs a script of ``scripts/`` under ``traceml run`` (CPU, gloo) and reads what it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass(frozen=True)
class Run:
    """One finished ``traceml run``: its report, its run folder and its output."""

    report: dict[str, Any]
    run_dir: Path
    stdout: str
    stderr: str

    @property
    def primary(self) -> str:
        return self.report["primary_diagnosis"]["kind"]

    def share(self, name: str) -> float | None:
        """The share of one component (``forward``, ``input_wait``...) in the step time."""
        for phase in self.report["phases"]:
            if phase["name"] == name:
                return phase.get("share")
        return None


def traceml_run(tmp_path: Path, script: str, *args: str, launcher: tuple[str, ...] = (),
                env: dict[str, str] | None = None, timeout: int = 240) -> Run:
    """``traceml run scripts/<script> [launcher] -- args``; asserts it succeeded."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    path = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH", "")) if p)
    environ.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", PYTHONPATH=path,
                   OMP_NUM_THREADS="1", **(env or {}))
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(SCRIPTS / script), *launcher, "--", *args],
        env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    return Run(report, run_dir, result.stdout, result.stderr)
