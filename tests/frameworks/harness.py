"""Run an integration example through ``traceml run`` and read back what every rank wrote."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.local_copy_reader import ParsedSpan, read_spans

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "integrations"
CLOCK_TOLERANCE_NS = 1_000_000
RUNNER = Path(__file__).resolve().parent / "scripts" / "run_recording_windows.py"
PHASE_SPANS = frozenset({"traceml.forward", "traceml.backward", "traceml.optimizer", "traceml.h2d"})


@dataclass
class RankRun:
    """One rank's step spans (by step number), their phase spans, and its evaluation/checkpoint windows."""

    steps: list[ParsedSpan]
    children: dict[str, list[ParsedSpan]] = field(default_factory=dict)
    windows: list[tuple[str, int, int]] = field(default_factory=list)

    def phases(self, step: ParsedSpan) -> list[str]:
        return sorted(child.attributes["traceml.phase.name"] for child in self.children.get(step.span_id, []))


@dataclass
class FrameworkRun:
    ranks: dict[int, RankRun]
    report: dict
    output: str


def run_example(
    tmp_path: Path, example: str, nproc: int, *args: str, env: dict | None = None, torchrun: bool = False
) -> FrameworkRun:
    """``traceml run`` the example (a file in examples/integrations/, or an absolute path) with ``nproc``
    processes; fails the test if the run fails.

    ``torchrun``: launch with ``python -m torch.distributed.run`` directly, as a user without
    ``traceml run`` would, then make the report with ``traceml analyze RUN_DIR --format json``.
    """
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "TRACEML_", "ACCELERATE_", "WORLD_SIZE", "RANK", "LOCAL_"))}
    path = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    base.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), WINDOWS_DIR=str(tmp_path), PYTHONPATH=path,
                PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", **(env or {}))
    if torchrun:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), str(RUNNER)]
    else:
        launch = [sys.executable, "-m", "traceml_otel.cli", "run", str(RUNNER),
                  "--nproc-per-node", str(nproc), "--"]
    result = subprocess.run(
        [*launch, str(EXAMPLES / example), *args],
        env=base, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    if torchrun:
        analyzed = subprocess.run(
            [sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir), "--format", "json",
             "-o", str(run_dir / "report.json")],
            env=base, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )
        assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    ranks: dict[int, RankRun] = {}
    for rank in range(nproc):
        spans = read_spans(run_dir / f"rank-{rank}.traces.jsonl")
        steps = sorted((s for s in spans if s.name == "traceml.step"),
                       key=lambda s: s.attributes["traceml.step.number"])
        children: dict[str, list[ParsedSpan]] = defaultdict(list)
        for span in spans:
            if span.name in PHASE_SPANS:  # collective spans (issue 8) nest inside phases: not here
                children[span.parent_span_id].append(span)
        windows_file = tmp_path / f"rank-{rank}.json"
        windows = [tuple(w) for w in json.loads(windows_file.read_text())] if windows_file.exists() else []
        ranks[rank] = RankRun(steps, dict(children), windows)  # type: ignore[arg-type]
    report = json.loads((run_dir / "report.json").read_text())
    return FrameworkRun(ranks, report, output)


def assert_steps(
    run: FrameworkRun, *, parallelism: str, updates: int, steps_per_update: int, calls_per_step: int
) -> None:
    """What every integration must show, per rank (docs/integrations/*.md).

    ``steps_per_update``: step spans per optimizer update (1 when micro-batches are folded into the
    step, else the accumulation); ``calls_per_step``: forward and backward calls inside one step span.
    """
    for rank, rank_run in run.ranks.items():
        steps = rank_run.steps
        assert steps, f"rank {rank} wrote no step spans"
        assert len(steps) == updates * steps_per_update, (rank, len(steps))
        assert sum(s.attributes["traceml.optimizer.steps"] for s in steps) == updates
        for step in steps:
            attrs = step.attributes
            assert attrs["traceml.rank"] == rank and attrs["traceml.parallelism"] == parallelism
            assert attrs.get("traceml.input_wait.cpu_duration", -1) >= 0, f"no input wait on {attrs}"
            assert attrs["traceml.input_wait.fetches"] >= 1
            phases = rank_run.phases(step)
            assert phases.count("forward") == phases.count("backward") == calls_per_step, phases
            assert phases.count("optimizer") == attrs["traceml.optimizer.steps"] <= 1, phases
            children = sorted(rank_run.children[step.span_id], key=lambda c: c.start_ns)
            for child in children:  # children inside their step
                assert step.start_ns <= child.start_ns <= child.end_ns <= step.end_ns
            for before, after in itertools.pairwise(children):  # no time counted twice
                assert before.end_ns <= after.start_ns, (before.name, after.name)
        for kind, started, ended in rank_run.windows:
            for step in steps:
                # 1 ms for the two clock anchors (the runner's and init()'s wall/monotonic pairs)
                before = step.end_ns <= started + CLOCK_TOLERANCE_NS
                assert before or step.start_ns >= ended - CLOCK_TOLERANCE_NS, (
                    f"rank {rank} step {step.attributes['traceml.step.number']} overlaps {kind}"
                )
