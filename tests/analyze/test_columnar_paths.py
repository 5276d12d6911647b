"""The columnar engine reads exactly the run folder's own step tables (issue 38): real ``traceml
analyze`` processes on folders whose names DuckDB would once have read as patterns or a home folder.

- ``run[x]`` beside ``runx``: the columnar engine reports ``run[x]``'s own numbers, the span reader's,
  never ``runx``'s (``[x]`` is a glob class matching ``runx``).
- A table that is a symbolic link (to a neighbour's) is refused, not followed.
- A folder named ``~`` is analysed as itself, not ``$HOME``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyze.test_columnar import _assert_same as _same
from tests.analyze.test_columnar import in_time_removed
from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.wire.step_table import table_file_name

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("duckdb") is None and not os.environ.get("CI"),
                                reason="duckdb is not installed")


def _steps(wait: float) -> list[SyntheticStep]:
    return [SyntheticStep(rank=rank, step=n, world_size=2, input_wait=wait, backward=0.004)
            for rank in range(2) for n in range(40)]


def _analyze(cwd: Path, folder: str, engine: str, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home))
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", folder, "--engine", engine,
                           "--format", "json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    report.pop("generated_at", None)
    report["run"].pop("source", None)
    return in_time_removed(report)


def _input_wait(report: dict) -> float:
    return report["ranks"][0]["input_wait_s"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("globs")
    write_run(root / "run[x]", "own", _steps(0.002))
    write_run(root / "runx", "neighbour", _steps(0.2))
    write_run(root / "~", "tilde", _steps(0.003))
    write_run(root / "home", "home-run", _steps(0.3))
    return root


def test_a_folder_with_glob_characters_is_read_as_itself(folders: Path) -> None:
    python = _analyze(folders, "run[x]", "python", folders / "home")
    columnar = _analyze(folders, "run[x]", "columnar", folders / "home")
    assert python["run"]["run_id"] == "own" and _input_wait(python) == pytest.approx(0.002, rel=1e-6)
    _same(python, columnar)


def test_a_folder_named_tilde_is_not_the_home_folder(folders: Path) -> None:
    python = _analyze(folders, "~", "python", folders / "home")
    columnar = _analyze(folders, "~", "columnar", folders / "home")
    assert python["run"]["run_id"] == "tilde" and _input_wait(python) == pytest.approx(0.003, rel=1e-6)
    _same(python, columnar)


def test_a_symlinked_table_is_refused(folders: Path, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    for path in (folders / "run[x]").iterdir():
        (linked / path.name).write_bytes(path.read_bytes())
    table = linked / table_file_name(1)
    table.unlink()
    table.symlink_to(folders / "runx" / table_file_name(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(linked), "--engine",
                           "columnar"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "symbolic link" in line and "not followed" in line, line
