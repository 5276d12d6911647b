"""Verdicts that state their evidence: missing and partial ranks, and how a failed run failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.kinds import RunKind
from traceml_otel.report import render

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"


def _kinds(analysis) -> list[str]:
    return [str(f.kind) for f in analysis.run_findings]


def test_a_rank_that_sent_nothing_is_named(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n, world_size=2) for n in range(30)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert _kinds(analysis) == [RunKind.MISSING_RANKS]
    assert analysis.run.missing_ranks == (1,)
    text = " ".join(render(analysis, "text").split())  # wrapped lines joined
    assert "World size 2, ranks seen [0]: rank 1 recorded no step" in text


def test_a_rank_that_stopped_early_is_partial(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=r, step=n, world_size=2)
             for r in range(2) for n in range(60 if r == 0 else 21)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert _kinds(analysis) == [RunKind.PARTIAL_RANKS]
    assert "rank 1 21 steps (0-20), against 60" in analysis.run_findings[0].why
    assert analysis.window.steps == 21


def test_healthy_runs_and_a_one_step_gap_carry_no_caution(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=r, step=n, world_size=2)
             for r in range(2) for n in range(60 if r == 0 else 59)]
    analysis = analyze_path([write_run(tmp_path / "run", "r", steps)])
    assert analysis.run_findings == ()
    assert "Caution" not in render(analysis, "text")


def test_exit_code_without_a_failed_step_is_reported(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", "r", [SyntheticStep(rank=0, step=n) for n in range(30)])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "exit_code": 3}))
    (finding,) = analyze_path([run_dir]).run_findings
    assert finding.kind is RunKind.RUN_FAILED and "exited with code 3 after step 29" in finding.why


def _traceml_run(tmp_path: Path, *arguments: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", *arguments], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=180)
    (run_dir,) = (tmp_path / "runs").iterdir()
    return result, json.loads((run_dir / "report.json").read_text())


def test_script_that_raises_at_step_30_names_the_step_and_exception(tmp_path: Path) -> None:
    result, report = _traceml_run(tmp_path, str(STEADY), "--", "--steps", "50", "--raise-at", "30")
    assert result.returncode == 1
    (finding,) = report["run_findings"]
    assert finding["kind"] == "RUN_FAILED"
    assert "Rank 0 raised RuntimeError in step 30" in finding["why"]
    assert "exited with code 1" in finding["why"]
    assert report["run"]["failures"] == [{"rank": 0, "step": 30, "exception_type": "RuntimeError"}]
    assert "raised RuntimeError in step 30" in " ".join(result.stdout.split())


def test_two_rank_run_with_a_silent_rank_names_it(tmp_path: Path) -> None:
    result, report = _traceml_run(tmp_path, "--nproc-per-node", "2", str(STEADY), "--",
                                  "--steps", "25", "--silent-rank", "1")
    assert result.returncode == 0, result.stderr
    assert report["run"]["world_size"] == 2 and report["run"]["ranks"] == [0]
    assert report["run"]["missing_ranks"] == [1]
    assert [f["kind"] for f in report["run_findings"]] == ["MISSING_RANKS"]
    assert "ranks seen [0]: rank 1 recorded no step" in " ".join(result.stdout.split())


def test_a_huge_world_size_from_span_data_is_bounded() -> None:
    from traceml_otel.analyze.evidence import MAX_LISTED_RANKS, missing_rank_count, missing_ranks

    huge = 18446744073709551616  # a corrupt or hostile traceml.world_size: must not be enumerated
    absent = missing_ranks(huge, [0, 1])
    assert len(absent) == MAX_LISTED_RANKS and absent[:2] == (2, 3)
    assert missing_rank_count(huge, [0, 1, -5]) == huge - 2
    assert missing_ranks(4, [0, 2]) == (1, 3) and missing_rank_count(4, [0, 2, 9]) == 2
