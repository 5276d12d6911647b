"""Run a script that never imports traceml under ``traceml run`` and read back every rank's spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.frameworks.harness import PHASE_SPANS, REPO, RankRun
from tests.local_copy_reader import read_spans


@dataclass
class ZeroCodeRun:
    ranks: dict[int, RankRun]
    report: dict
    output: str
    run_dir: Path


def clean_env(tmp: Path, env: dict | None = None) -> dict[str, str]:
    """The caller's environment without launcher or telemetry variables, runs under ``tmp``."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "TRACEML_", "ACCELERATE_", "WORLD_SIZE", "RANK", "LOCAL_"))}
    base.pop("PYTHONPATH", None)  # the script must not find the test package: it imports nothing of ours
    base.update(TRACEML_RUNS_DIR=str(tmp / "runs"), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    return base


def read_run(run_dir: Path, nproc: int) -> dict[int, RankRun]:
    ranks: dict[int, RankRun] = {}
    for rank in range(nproc):
        spans = read_spans(run_dir / f"rank-{rank}.traces.jsonl")
        steps = sorted((s for s in spans if s.name == "traceml.step"),
                       key=lambda s: s.attributes["traceml.step.number"])
        children: dict[str, list] = defaultdict(list)
        for span in spans:
            if span.name in PHASE_SPANS:
                children[span.parent_span_id].append(span)
        ranks[rank] = RankRun(steps, dict(children))
    return ranks


def traceml_run(tmp: Path, script: Path, *args: str, nproc: int = 1, env: dict | None = None,
                launcher_args: tuple[str, ...] = ()) -> ZeroCodeRun:
    """``traceml run [launcher_args] script args`` with ``nproc`` ranks; fails the test if it fails."""
    return traceml_runs_together([(tmp, script, args)], nproc=nproc, env=env, launcher_args=launcher_args)[0]


def traceml_runs_together(
    runs: list[tuple[Path, Path, tuple[str, ...]]], *, nproc: int = 1, env: dict | None = None,
    launcher_args: tuple[str, ...] = (),
) -> list[ZeroCodeRun]:
    """Several ``traceml run`` launches at the same time (each in its own folder), so that they share
    the machine's load; each must succeed."""
    children = []
    for tmp, script, args in runs:
        with open(tmp / "launch-output.txt", "w") as log:  # a file, not a pipe: no child ever blocks on us
            children.append((tmp, subprocess.Popen(
                [sys.executable, "-m", "traceml_otel.cli", "run", *launcher_args, "--nproc-per-node",
                 str(nproc), str(script), *args],
                env=clean_env(tmp, env), cwd=tmp, stdout=log, stderr=subprocess.STDOUT, text=True,
            )))
    return [_finish(tmp, child, nproc) for tmp, child in children]


def _finish(tmp: Path, child: subprocess.Popen, nproc: int) -> ZeroCodeRun:
    try:
        child.wait(timeout=240)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    output = (tmp / "launch-output.txt").read_text()
    assert child.returncode == 0, output[-6000:]
    (run_dir,) = (tmp / "runs").iterdir()
    report_file = run_dir / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return ZeroCodeRun(read_run(run_dir, nproc), report, output, run_dir)


__all__ = ["REPO", "ZeroCodeRun", "clean_env", "read_run", "traceml_run", "traceml_runs_together"]
