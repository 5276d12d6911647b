"""`traceml run` behaves like torchrun: script arguments, a missing script, direct launches' manifests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_otel.run_identity import readable_run_id
from traceml_otel.settings import load_settings

HERE = Path(__file__).resolve().parent
ECHO = HERE / "scripts" / "echo_args.py"
STEADY = HERE / "scripts" / "steady_loop.py"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    return env


def _traceml(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", *arguments], env=_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def _echoed(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))


@pytest.mark.parametrize(
    ("arguments", "script_args"),
    [
        (["--no-report", str(ECHO), "--batch-size", "32"], ["--batch-size", "32"]),
        ([str(ECHO), "--batch-size", "32", "--nproc-per-node", "4"],
         ["--batch-size", "32", "--nproc-per-node", "4"]),  # torchrun's rule: after the script, the script's
        ([str(ECHO), "--", "--batch-size", "32"], ["--batch-size", "32"]),
        ([str(ECHO), "--no-report", "--", "--lr", "1"], ["--lr", "1"]),  # the older form
        ([str(ECHO), "--no-report", "--batch-size", "32"], ["--batch-size", "32"]),  # launcher option first
        ([str(ECHO)], []),
    ],
)
def test_everything_after_the_script_goes_to_it(
    tmp_path: Path, arguments: list[str], script_args: list[str]
) -> None:
    echoed = _echoed(_traceml(tmp_path, *arguments))
    assert echoed["argv"] == script_args
    # one process: the environment `python train.py` has, none of torchrun's variables (issue 38)
    torchrun_names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    assert [echoed[k] for k in torchrun_names] == [None] * 5


def test_a_missing_script_is_one_line_and_rc_2_with_no_run_folder(tmp_path: Path) -> None:
    result = _traceml(tmp_path, "nope.py", "--batch-size", "32")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["traceml run: error: script nope.py not found"]
    assert result.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_one_process_launch_does_not_import_torch_in_the_launcher(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from traceml_otel.cli import main
        code = main(["run", "--no-report", {str(ECHO)!r}])
        print("torch imported:", "torch" in sys.modules, "rc", code)
    """)
    result = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert "torch imported: False rc 0" in result.stdout, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["launcher"][1:3] == ["-u", str(ECHO)] and manifest["exit_code"] == 0


def test_direct_torchrun_writes_a_manifest_in_a_readable_folder(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(STEADY),
         "--steps", "5"], env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("steady_loop-")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["run_id"] == run_dir.name and manifest["launcher"] == ["torchrun"]
    assert manifest["world_size"] == 1 and manifest["written_by"] == "rank 0"
    assert manifest["end_time"] >= manifest["start_time"] and manifest["end_status"] == "ok"


def test_direct_python_run_that_raises_records_it_in_the_manifest(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(STEADY), "--steps", "40", "--raise-at", "30"],
                            env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["launcher"] == ["python"] and manifest["exit_code"] == 1
    assert manifest["exception_type"] == "RuntimeError"
    report = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir), "--format", "json"],
        capture_output=True, text=True, timeout=60)
    (finding,) = json.loads(report.stdout)["run_findings"]
    assert "raised RuntimeError in step 30" in finding["why"] and "exited with code 1" in finding["why"]


def test_run_ids_of_direct_launches_are_readable() -> None:
    uuid = "3f2a9c1b-7d4e-4c5b-9a1f-0e8d7c6b5a49"
    assert readable_run_id("train", uuid) == readable_run_id("train", uuid)  # every rank agrees
    assert readable_run_id("train", uuid).startswith("train-3f2a9c1b-")
    assert readable_run_id("train", "exp7") == "train-exp7"
    settings = load_settings({"TORCHELASTIC_RUN_ID": uuid, "TRACEML_RUN_NAME": "train", "RANK": "0"})
    assert settings.run_id == readable_run_id("train", uuid) and settings.launcher == "torchrun"


@pytest.mark.parametrize(
    ("argv", "nproc", "script_args"),
    [
        (["run", "train.py", "--nproc-per-node=4"], 4, []),  # the README's headline command
        (["run", "train.py", "--nproc-per-node", "2", "--lr", "1"], 2, ["--lr", "1"]),
        (["run", "train.py", "--lr", "1", "--nproc-per-node", "2"], 1,
         ["--lr", "1", "--nproc-per-node", "2"]),
        (["run", "train.py", "--", "--run-name", "x"], 1, ["--run-name", "x"]),
        (["run", "train.py", "a", "--", "b"], 1, ["a", "--", "b"]),
    ],
)
def test_launcher_options_right_after_the_script_stay_the_launchers(
    argv: list[str], nproc: int, script_args: list[str]
) -> None:
    from traceml_otel.cli import build_parser
    from traceml_otel.cli.run import split_script_arguments

    args = split_script_arguments(build_parser().parse_args(argv), argv)
    assert (args.nproc_per_node, args.script_args) == (nproc, script_args)
