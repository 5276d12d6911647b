"""The command line's traps, one test each: a typo before the script, impossible values, a script
that fails before telemetry starts, ``analyze`` on the runs folder, ``--json``/``--html``, ``-m``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.cli import main

REPO = Path(__file__).resolve().parents[2]


def _traceml(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", *arguments], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_a_mistyped_launcher_option_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--nprocs-per-node", "2", "train.py"]) == 2
    error = capsys.readouterr().err
    assert "unknown option --nprocs-per-node (did you mean --nproc-per-node?)" in error
    assert "{run,stack,analyze,compare}" not in error  # not the top-level usage


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--nproc-per-node", "0", "must be at least 1, got 0"),
    ("--nnodes", "-1", "must be at least 1, got -1"),
    ("--master-port", "70000", "must be between 1 and 65535, got 70000"),
    ("--nproc-per-node", "two", "not a whole number: 'two'"),
])
def test_impossible_option_values_are_refused_plainly(
    capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", option, value, "train.py"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {option}: {message}" in error and "Traceback" not in error
    assert error.count("\n") == 1 and "usage:" not in error  # one line, as the README promises


@pytest.mark.parametrize(("argv", "expected"), [
    (["analyze", "--fromat", "json", "x"],
     "traceml analyze: error: unrecognized arguments: --fromat (did you mean --format?)"),
    (["analyz", "x"], "(did you mean analyze?)"),
    (["compare", "a", "b", "--fail-on-regresion"], "(did you mean --fail-on-regression?)"),
    (["analyze", "--engine", "colum", "x"], "invalid choice: 'colum'"),
])
def test_a_mistyped_option_or_command_gets_one_line_with_the_closest_spelling(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert expected in error and error.count("\n") == 1 and "usage:" not in error, error
    assert error.rstrip().endswith("--help")


def test_analyse_is_the_same_command_as_analyze(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", "r", [SyntheticStep(rank=0, step=n) for n in range(30)])
    assert main(["analyse", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "traceml-otel/report"


def test_an_html_report_on_a_terminal_goes_to_a_file(tmp_path: Path) -> None:
    """Under a real terminal (``script`` gives the command a pty), ``--format html`` without ``-o``
    writes report.html into the run folder and prints its path; with no run folder it asks for ``-o``."""
    run = write_run(tmp_path / "run", "r", [SyntheticStep(rank=0, step=n) for n in range(30)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def on_a_terminal(*arguments: str) -> str:
        command = " ".join([sys.executable, "-m", "traceml_otel.cli", *arguments])
        done = subprocess.run(["script", "-qec", command, "/dev/null"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        return done.stdout

    screen = on_a_terminal("analyze", str(run), "--format", "html")
    assert f"wrote {run / 'report.html'}" in screen and "<!DOCTYPE" not in screen
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")
    screen = on_a_terminal("analyze", str(run / "rank-0.traces.jsonl"), "--html")
    assert "an HTML report goes to a file: add -o" in screen and "<!DOCTYPE" not in screen


@pytest.mark.parametrize(("body", "own_error"), [
    ("import argparse\np = argparse.ArgumentParser()\n"
     "p.add_argument('--lr', required=True)\np.parse_args()\n",
     "the following arguments are required: --lr"),
    ("import not_a_module_anyone_has\n", "No module named 'not_a_module_anyone_has'"),
])
def test_a_script_failing_before_telemetry_says_so_under_its_own_error(
    tmp_path: Path, body: str, own_error: str
) -> None:
    (tmp_path / "early.py").write_text(body)
    result = _traceml(tmp_path, "run", "early.py")
    assert result.returncode != 0
    assert own_error in result.stderr
    assert "before telemetry started (it never reached traceml.init())" in result.stderr
    assert result.stderr.index(own_error) < result.stderr.index("before telemetry started")
    assert "did the script call traceml.init()" not in result.stdout + result.stderr
    assert "no diagnosis" not in result.stdout


def test_analyze_on_the_runs_folder_lists_the_runs_newest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "traceml-runs"
    for age, name in ((300, "old"), (10, "new"), (100, "middle")):
        run = write_run(parent / name, name, [SyntheticStep(rank=0, step=n) for n in range(3)])
        stamp = run.stat().st_mtime - age
        os.utime(run, (stamp, stamp))
    (parent / "not-a-run").mkdir()
    assert main(["analyze", str(parent)]) == 0  # asked plainly, the list is the answer (no "error:")
    out, err = capsys.readouterr()
    assert "is a runs folder with 3 runs" in out and "not-a-run" not in out and err == ""
    listed = [line.split()[-1] for line in out.splitlines() if line.startswith("  20")]
    assert [Path(p).name for p in listed] == ["new", "middle", "old"]
    assert f"e.g. traceml analyze {parent / 'new'}" in out
    # a report asked of a runs folder is no report: exit 2 and the same list, as the error
    assert main(["analyze", str(parent), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("traceml analyze: error: ") and "is a runs folder with 3 runs" in err


def test_json_and_html_work_as_format_aliases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", "r", [SyntheticStep(rank=0, step=n) for n in range(30)])
    assert main(["analyze", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "traceml-otel/report"
    assert main(["analyze", str(run), "--html"]) == 0
    assert capsys.readouterr().out.startswith("<!DOCTYPE html>")
    assert main(["compare", str(run), str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] in ("EQUIVALENT", "INCONCLUSIVE")  # one run a side


def test_run_launches_a_module_with_m_as_torchrun_does(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint('module ran with', sys.argv[1:], __name__)\n")
    result = _traceml(tmp_path, "run", "--no-report", "-m", "mypkg.train", "--lr", "1")
    assert result.returncode == 0, result.stderr
    assert "module ran with ['--lr', '1'] __main__" in result.stdout
    assert "no module named" in _traceml(tmp_path, "run", "-m", "mypkg.absent").stderr
