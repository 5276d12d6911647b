"""One error root: every error raised on purpose is a TracemlError; the CLI tells a user's error (exit 2,
one line) from a bug (exit 70, the traceback)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze.otlp_decode import ForeignDocument
from traceml_otel.analyze.sources.base import SourceError
from traceml_otel.cli import main
from traceml_otel.cli.analyze import RunsFolderGiven
from traceml_otel.cli.common import EXIT_ERROR, EXIT_INTERNAL
from traceml_otel.errors import SettingsError, TracemlError, UsageError
from traceml_otel.report.run_summary import ReportFormatError
from traceml_otel.stack.config import StackConfigError
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.bounded_file import RefusedFile
from traceml_otel.wire.frames import WireError

PACKAGE = Path(__file__).resolve().parents[1] / "traceml_otel"
_BUILTIN_ERRORS = {"Exception", "ValueError", "RuntimeError", "OSError", "TypeError", "KeyError",
                   "LookupError"}


@pytest.mark.parametrize(("error", "builtin"), [
    (SettingsError, ValueError), (StackConfigError, ValueError), (SourceError, RuntimeError),
    (ForeignDocument, ValueError), (ReportFormatError, ValueError), (RecordError, ValueError),
    (RefusedFile, OSError), (WireError, ValueError), (UsageError, ValueError), (RunsFolderGiven, ValueError),
])
def test_every_error_has_the_one_root_and_keeps_its_builtin_base(error: type, builtin: type) -> None:
    assert issubclass(error, TracemlError) and issubclass(error, builtin)


def test_no_public_exception_class_outside_the_root() -> None:
    """A new exception class deriving straight from a built-in one must join the root (private ones,
    used for control flow inside a module, excepted)."""
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            public = isinstance(node, ast.ClassDef) and not node.name.startswith("_")
            if public and node.name != "TracemlError":
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & _BUILTIN_ERRORS and not bases - _BUILTIN_ERRORS:
                    outside.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert outside == []


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    steps = [SyntheticStep(rank=0, step=n) for n in range(20)]
    return write_run(tmp_path_factory.mktemp("errors") / "run-e", "run-e", steps)


def test_a_users_error_is_exit_2_on_one_line(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(run_dir), "--window", "0"]) == EXIT_ERROR
    assert capsys.readouterr().err == "traceml analyze: error: window size must be at least 1 step\n"
    # compare read the window before it caught anything: a traceback, exit 1
    assert main(["compare", str(run_dir), str(run_dir), "--window", "0"]) == EXIT_ERROR
    assert capsys.readouterr().err == "traceml compare: error: window size must be at least 1 step\n"
    tempo = ["--tempo", "http://127.0.0.1:9", "--run-id", "r"]
    assert main(["analyze", "--since", "yesterday-ish", *tempo]) == EXIT_ERROR
    assert "error: cannot read the time 'yesterday-ish'" in capsys.readouterr().err


@pytest.mark.parametrize("bug", [ValueError("bad index"), KeyError("phase"), TypeError("NoneType")])
def test_a_bug_is_an_internal_error_not_bad_input(run_dir: Path, bug: Exception,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise bug

    monkeypatch.setattr("traceml_otel.cli.analyze.analyze_path", broken)
    assert main(["analyze", str(run_dir)]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("traceml analyze: internal error: this is a bug in traceml-otel, not in your input")
    assert "Traceback (most recent call last)" in err and f"{type(bug).__name__}: " in err
    assert "error: bad index" not in err


def test_a_runs_folder_is_listed_one_run_per_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("run-1", "run-2"):
        write_run(tmp_path / name, name, [SyntheticStep(rank=0, step=n) for n in range(3)])
    assert main(["analyze", str(tmp_path), "--format", "json"]) == EXIT_ERROR
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"traceml analyze: error: {tmp_path} is a runs folder with 2 runs (newest first); "
                        "analyze one of them:")
    assert len(lines) == 4 and lines[1].startswith("  ") and lines[3].startswith("e.g. traceml analyze ")
