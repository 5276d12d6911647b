"""A real run with an unmarked evaluation between steps (``scripts/unmarked_evaluation.py``: two passes
of ~1.5 s under no_grad that no outside_step names): both engines call it time between steps with a
note naming its steps, never a STALL "made no progress" (it was three STALL cautions and 61 % of the
wall time billed stalled before)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_otel.analyze.pipeline import analyze_path

SCRIPT = Path(__file__).resolve().parent / "scripts" / "unmarked_evaluation.py"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("busy-gaps")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(runs), PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (found,) = runs.iterdir()
    return found


@pytest.mark.parametrize("engine", ["python", "columnar"])
def test_an_unmarked_evaluation_is_time_between_steps_not_a_stall(run_dir: Path, engine: str) -> None:
    analysis = analyze_path([run_dir], engine=engine)
    assert analysis.stalls.events == (), analysis.stalls.events
    assert [g.step for g in analysis.stalls.busy_gaps] == [60, 120]
    account = analysis.time_account
    assert account is not None
    got = dict(account.ranks[0].categories)
    assert got["stalled"] < 0.5 and got["between_steps"] > 2.0, got
    assert any("long gap(s) between steps were work" in note and "before step 60" in note
               for note in account.notes), account.notes
