"""Where a run's files go, and which names may make a folder: real ``traceml run`` launches.

- The runs folder is fixed by the launcher before the script starts (``TRACEML_RUNS_DIR``, absolute):
  a script that changes its working directory before ``traceml.init()`` still writes where the
  launcher looks, so the diagnosis and ``--hang-action terminate`` find its ranks.
- ``--run-id``/``--run-name``/``TRACEML_RUN_ID`` are one safe path component, else one line and exit 2.
- A run id whose folder holds another launch's data is refused unless ``--resume``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "launch" / "scripts"
CHDIR = SCRIPTS / "chdir_then_init.py"
ECHO = SCRIPTS / "echo_args.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def _run(cwd: Path, *arguments: str, timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", *arguments], env=_env(**extra),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_chdir_before_init_still_writes_where_the_launcher_looks(tmp_path: Path) -> None:
    done = _run(tmp_path, "--run-id", "moved", str(CHDIR))  # the default runs folder: ./traceml-runs
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "traceml-runs" / "moved"
    assert (run_dir / "rank-0.steps.csv").is_file()
    assert not (tmp_path / "elsewhere" / "traceml-runs").exists()
    assert "did the script call traceml.init()" not in done.stdout + done.stderr
    assert "30 steps" in done.stdout or "30 aligned" in done.stdout, done.stdout[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["steps_read"] == 30


def test_a_chdir_before_init_does_not_stop_hang_action_terminate(tmp_path: Path) -> None:
    done = _run(tmp_path, "--no-report", "--hang-action", "terminate", "--run-id", "stuck", str(CHDIR),
                "--hang", TRACEML_HANG_TIMEOUT_S="3", TRACEML_SHUTDOWN_TIMEOUT_S="3")
    assert done.returncode == 75, done.stderr[-3000:]
    assert (tmp_path / "traceml-runs" / "stuck" / "rank-0.hang.json").is_file()


@pytest.mark.parametrize("run_id", ["../escaped-run", "/tmp/absolute-run", "a\nb", "exp[1]", ".", "-x", "~"])
def test_an_unsafe_run_id_is_refused_with_one_line(tmp_path: Path, run_id: str) -> None:
    done = _run(tmp_path, f"--run-id={run_id}", str(ECHO), TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a safe name" in lines[0], done.stderr
    assert done.stdout == "" and not (tmp_path / "runs").exists() and not (tmp_path / "escaped-run").exists()


def test_an_unsafe_run_name_or_environment_id_is_refused(tmp_path: Path) -> None:
    named = _run(tmp_path, "--run-name", "../up", str(ECHO), TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    from_env = _run(tmp_path, str(ECHO), TRACEML_RUNS_DIR=str(tmp_path / "runs"), TRACEML_RUN_ID="../../x")
    for done, what in ((named, "--run-name"), (from_env, "TRACEML_RUN_ID")):
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and what in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_bad_environment_id_in_a_rank_turns_telemetry_off_with_one_line(tmp_path: Path) -> None:
    code = "import traceml_otel as t; print('active', t.init())"
    env = _env(TRACEML_RUN_ID="../../x", TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and "active False" in done.stdout, done.stderr
    said = [line for line in done.stderr.splitlines() if "TRACEML_RUN_ID" in line]
    assert len(said) == 1 and "telemetry disabled" in said[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "x").exists()


def test_a_reused_run_id_is_refused_unless_resumed(tmp_path: Path) -> None:
    runs = str(tmp_path / "runs")
    first = _run(tmp_path, "--no-report", "--run-id", "same", str(ECHO), TRACEML_RUNS_DIR=runs)
    assert first.returncode == 0, first.stderr
    again = _run(tmp_path, "--no-report", "--run-id", "same", str(ECHO), TRACEML_RUNS_DIR=runs)
    assert again.returncode == 2 and again.stdout == ""
    (line,) = again.stderr.strip().splitlines()
    assert "already holds another run's data" in line and "--resume" in line
    resumed = _run(tmp_path, "--no-report", "--resume", "--run-id", "same", str(ECHO), TRACEML_RUNS_DIR=runs)
    assert resumed.returncode == 0, resumed.stderr


def test_a_run_folder_path_with_a_newline_is_printed_on_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs\nINJECTED"
    done = _run(tmp_path, "--run-id", "nl", str(SCRIPTS / "steady_loop.py"), "--steps", "5",
                TRACEML_RUNS_DIR=str(runs))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (runs / "nl" / "rank-0.steps.csv").is_file()
    output = done.stdout + done.stderr
    assert not [line for line in output.splitlines() if line.startswith("INJECTED")], output[-3000:]
    assert "runs\\nINJECTED" in output  # the path, with its newline written as an escape
    listed = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", str(runs)], env=_env(),
                            capture_output=True, text=True, timeout=120, check=False)
    assert not [line for line in (listed.stdout + listed.stderr).splitlines() if line.startswith("INJECTED")]
