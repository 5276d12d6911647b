"""``fsdp`` is claimed where it runs: FSDP2 ``fully_shard`` on 2 CPU processes over gloo."""

from __future__ import annotations

from pathlib import Path

from tests.frameworks.harness import assert_steps, run_example

SCRIPT = Path(__file__).resolve().parent / "scripts" / "fsdp2_train.py"


def test_fully_shard_on_two_ranks_is_fsdp(tmp_path: Path) -> None:
    run = run_example(tmp_path, str(SCRIPT), 2)
    assert_steps(run, parallelism="fsdp", updates=12, steps_per_update=1, calls_per_step=1)
    assert run.report["run"]["parallelism"] == "fsdp"
    assert "FSDP" in run.report["severity_caps"]
