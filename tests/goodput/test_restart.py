"""Steps redone after a restart are lost time: a real ``traceml run --max-restarts 1`` whose first
attempt fails after step 10 (checkpoint at 8) and whose second resumes from the checkpoint with
``traceml.resume_from(8)``, redoing two steps. One run (about 10 s on an idle machine, most of it
three interpreters importing torch) shared by the assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.analyze.time_accounting import read_time_records

SCRIPT = Path(__file__).parent / "scripts" / "restart.py"


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("restart")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp / "runs"), RESTART_OUT=str(tmp / "out"), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--max-restarts", "1", "--no-report",
               str(SCRIPT)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp / "runs").iterdir())
    truth = {a: json.loads((tmp / f"out.attempt-{a}.json").read_text())["took"] for a in (0, 1)}
    return {"run_dir": run_dir, "truth": truth, "analysis": analyze_path([run_dir])}


def test_both_attempts_steps_are_kept_apart(restarted: dict) -> None:
    records, problems = read_time_records(restarted["run_dir"])
    assert not problems
    record = records[0]
    assert (record.restart, record.first_step, record.resumed_from, record.earlier_progress) == (1, 10, 8, 10)
    assert record.steps == 16  # 10 + 6, numbered on: the second attempt's spans keep their own trace ids
    from traceml_otel.analyze.sources.files import FileSpanSource

    steps = FileSpanSource([restarted["run_dir"]]).load().steps
    assert sorted(s.step for s in steps) == list(range(16))  # none seen twice, none lost


def test_redone_steps_count_as_lost(restarted: dict) -> None:
    account = restarted["analysis"].time_account
    assert account is not None
    (rank,) = account.ranks
    got = dict(rank.categories)
    redone_truth = sum(restarted["truth"][1][:2])  # the second attempt's first two steps redo 9 and 10
    assert got["redone_steps"] == pytest.approx(redone_truth, rel=0.05, abs=0.01)
    # the other steps stay productive: 14 distinct steps of about 0.1 s
    productive = sum(v for k, v in got.items() if k.startswith("step.") and k != "step.input_wait")
    truth_productive = sum(restarted["truth"][0]) + sum(restarted["truth"][1][2:])
    assert productive == pytest.approx(truth_productive, rel=0.05)
    assert got["restarts"] > 0  # from the failed attempt's last step to the new process
    assert sum(got.values()) == pytest.approx(rank.wall_s, rel=0.02)
    assert "steps redone after a restart" not in [f.text for f in account.findings]  # 0.2 s: no finding


def test_every_restarts_gap_is_billed_to_restarts(tmp_path: Path) -> None:
    """``--max-restarts 2`` with two failures (after steps 10 and 13): both gaps, from an attempt's last
    step to the next attempt's process start, are ``restarts``; none of them is ``between_steps``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), RESTART_OUT=str(tmp_path / "out"),
               RESTART_FAILURES="2", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--max-restarts", "2", "--no-report",
               str(SCRIPT)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    truth = [json.loads((tmp_path / f"out.attempt-{a}.json").read_text()) for a in (0, 1, 2)]
    gaps = [truth[a + 1]["forked"] - truth[a]["failed"] for a in (0, 1)]
    assert all(gap > 0 for gap in gaps)
    (run_dir,) = (tmp_path / "runs").iterdir()
    account = analyze_path([run_dir]).time_account
    assert account is not None
    (rank,) = account.ranks
    got = dict(rank.categories)
    # /proc's start is 10 ms coarse; the last step's end is the span's, the truth's a moment later
    assert got["restarts"] == pytest.approx(sum(gaps), rel=0.05, abs=0.1), (got, gaps)
    assert got["between_steps"] < 0.5, got  # was the first gap (8-14 s under torchrun on a loaded host)
    assert got["redone_steps"] > 0  # attempt 2 resumed from 12; attempt 1 had reached 13
    assert sum(got.values()) == pytest.approx(rank.wall_s, rel=0.02)
