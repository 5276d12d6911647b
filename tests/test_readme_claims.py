"""What README.md and the docs tell a new user to type must work: every ``traceml`` command they show
parses, and the local copy's file list names every file a real run writes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_otel.cli.entry import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
_COMMANDS = {"run", "analyze", "analyse", "compare", "stack", "top", "--version", "--help"}
_INLINE = re.compile(r"`(traceml (?:run|analyze|analyse|compare|stack)\b[^`]*)`")


def _shown_commands() -> list[tuple[str, str]]:
    """(document, command) for every ``traceml`` command in a code block or inline code span."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in _FENCE.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ").replace(".venv/bin/traceml", "traceml")
                line = line.split("&&")[-1].strip()
                if line.startswith("traceml ") or (" traceml " in line and "=" in line.split()[0]):
                    command = line[line.index("traceml "):]
                    if command.split()[1:2] and command.split()[1] in _COMMANDS:  # not a screen capture
                        found.append((doc.name, command))
        for command in _INLINE.findall(text):
            complete = re.search(r"\.py\b|traceml-runs/|RUN_DIR|\.json\b", command)  # prose names a
            if complete and not re.search(r"[\[|…]|\.\.\.", command):  # command; these are whole ones
                found.append((doc.name, command))
    return found


COMMANDS = _shown_commands()


def test_the_docs_show_commands_at_all() -> None:
    assert len(COMMANDS) > 20
    assert any(command.startswith("traceml run") for _, command in COMMANDS)


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_every_command_the_docs_show_parses(doc: str, command: str) -> None:
    words = shlex.split(command, comments=True)[1:]
    try:
        build_parser().parse_args(words)
    except SystemExit as exit_info:
        pytest.fail(f"{doc} shows `{command}`, which traceml refuses (exit {exit_info.code})")


@pytest.mark.parametrize("command", ["analyze", "compare"])
@pytest.mark.parametrize("alias", ["json", "html"])
def test_json_and_html_are_short_for_format_in_analyze_and_compare(command: str, alias: str) -> None:
    """The README: '--json and --html are short for --format json|html in analyze and compare'."""
    readme = (REPO / "README.md").read_text()
    assert "`--json` and `--html` are\n  short for `--format json|html` in `analyze` and `compare`" in readme
    positional = ["a", "b"] if command == "compare" else ["a"]
    assert build_parser().parse_args([command, *positional, f"--{alias}"]).format == alias


def test_the_local_copy_list_names_every_file_a_run_writes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "traceml_otel.cli", "run", str(REPO / "examples/quickstart.py")]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    readme = (REPO / "README.md").read_text().splitlines()
    row = next(line for line in readme if line.startswith("| local copy |"))
    named = [re.compile(re.escape(name.rsplit("/", 1)[-1]).replace("<R>", r"\d+").replace("<N>", r"\d+"))
             for name in re.findall(r"`([^`]+)`", row)]
    written = {path.name for path in run_dir.iterdir()} - {"report.json", "report.html"}
    unnamed = sorted(name for name in written if not any(pattern.fullmatch(name) for pattern in named))
    assert unnamed == [], f"README's local-copy row leaves out {unnamed}"
    # A capture's files (a loaded machine's spike, or asked for) are named too, whatever the run wrote.
    for name in ("rank-0.capture-request.json", "rank-0.capture-status.json", "rank-0.capture-1.json",
                 "rank-0.capture-1.trace.json.gz", ".capture-slot-0"):
        assert any(pattern.fullmatch(name) for pattern in named), name
