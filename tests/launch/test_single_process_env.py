"""A one-process ``traceml run`` leaves the training what ``python train.py`` makes it (issue 38).

torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...) made the Hugging Face Trainer and
Accelerate take their distributed path for one process: a DDP wrapper, a ``find_unused_parameters``
warning, collective time. A real script with a Trainer and an Accelerate ``prepare`` (no traceml
line; zero-code tracing attaches the Trainer callback) runs under ``python`` and under ``traceml run``:
the same code path in both, and the traced steps have no DDP and no collective span.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.local_copy_reader import read_spans
from tests.tools import import_or_missing
from traceml_otel import contract as c

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "framework_paths.py"


def _paths(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith('{"trainer_wrapper"')))


def test_trainer_and_accelerate_take_the_python_path(tmp_path: Path) -> None:
    import_or_missing("transformers")
    import_or_missing("accelerate")
    dropped = ("OTEL_", "TRACEML_", "ACCELERATE_", "WORLD_SIZE", "RANK", "LOCAL_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    plain = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "plain")], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=240, check=False)
    assert plain.returncode == 0, plain.stderr[-3000:]
    traced = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", "--run-id", "one", str(SCRIPT),
         str(tmp_path / "traced")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
        check=False)
    assert traced.returncode == 0, traced.stderr[-3000:]
    expected = {"trainer_wrapper": "Tiny", "trainer_mode": "ParallelMode.NOT_PARALLEL",
                "trainer_world_size": 1, "accelerate_type": "DistributedType.NO",
                "accelerate_wrapper": "Linear",
                "accelerate_processes": 1}
    assert _paths(plain.stdout) == expected
    assert _paths(traced.stdout) == expected
    assert "find_unused_parameters" not in traced.stdout + traced.stderr
    spans = read_spans(tmp_path / "runs" / "one" / "rank-0.traces.jsonl")
    steps = [s for s in spans if s.name == c.SPAN_STEP]
    assert len(steps) == 4  # the Trainer's 4 updates, traced by the attached callback
    assert {s.attributes["traceml.parallelism"] for s in steps} == {"none"}
    assert not [s for s in spans if s.name == c.SPAN_COLLECTIVE]
