"""The live view end to end: a real terminal (tmux), a pipe, a stopped rank, and ``traceml top``.

Real processes throughout: ``traceml run --nproc-per-node 2`` of a gloo job, read from a tmux pane with
``capture-pane`` or from a pipe. Waits are generous (a loaded 2-core machine), never tight timings.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "launch" / "scripts" / "live_ddp.py"
LINE = re.compile(r"^traceml-live (\S+=\S+(?: \S+=\S+)*)$")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", LIVE_PIDS_DIR=str(tmp_path),
               **extra)
    return env


def _wait(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _screen(pane: Pane, ok: Callable[[str], object], timeout: float, what: str, history: int = 0) -> str:
    """The pane's text once ``ok`` holds for it."""
    seen: list[str] = []

    def check() -> bool:
        seen[:] = [pane.text(history)]
        return bool(ok(seen[0]))

    _wait(check, timeout, what)
    return seen[0]


def parse_line(line: str) -> dict[str, str]:
    """One ``traceml-live`` line's fields (README.md, "Watching a run")."""
    match = LINE.match(line)
    assert match, line
    return dict(part.split("=", 1) for part in match[1].split(" "))


class Pane:
    def __init__(self, tmp_path: Path, command: str, env: dict[str, str]) -> None:
        self.socket = str(tmp_path / "tmux.sock")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in (
            "TRACEML_RUNS_DIR", "PYTHONPATH", "LIVE_PIDS_DIR", "PATH", "PYTHONUNBUFFERED"))
        shell = f"cd {shlex.quote(str(REPO))} && env {exports} {command}; echo PANE-EXITED; sleep 600"
        subprocess.run(["tmux", "-S", self.socket, "new-session", "-d", "-x", "160", "-y", "60", "-s",
                        "live", shell],
                       check=True, env={**env, "TERM": "xterm-256color"})

    def text(self, history: int = 0) -> str:
        return subprocess.run(["tmux", "-S", self.socket, "capture-pane", "-p", "-t", "live",
                               *(["-S", f"-{history}"] if history else [])],
                              capture_output=True, text=True, check=True).stdout

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


def _steps_shown(screen: str) -> int | None:
    match = re.search(r"traceml live\s+run \S+\s+ranks \d+/2 reporting\s+steps ([\d,]+)", screen)
    return int(match[1].replace(",", "")) if match else None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_panel_in_a_real_terminal_with_a_stopped_rank(tmp_path: Path) -> None:
    env = _env(tmp_path, PYTHONPATH=str(REPO))
    command = (f"{shlex.quote(sys.executable)} -m traceml_otel.cli run --nproc-per-node 2 --run-id live-tmux "
               f"{shlex.quote(str(SCRIPT))} 700 0.05")
    pane = Pane(tmp_path, command, env)
    try:
        first = _screen(pane, lambda s: (_steps_shown(s) or 0) > 5, 180, "the panel")
        time.sleep(3)
        second = pane.text()
        assert (_steps_shown(second) or 0) > (_steps_shown(first) or 0), second
        for screen in (first, second):
            assert "live-tmux" in screen  # the run id
            assert re.search(r"step time\s+\d", screen), screen
            for phase in ("forward", "backward", "optimizer", "exposed comm", "residual"):
                assert phase in screen, screen
        assert "script line: rank" in second  # the script's own prints, above the panel

        pid = int((tmp_path / "rank1.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            screen = _screen(pane, lambda s: "NOT REPORTING: rank 1:" in s, 30, "rank 1 marked not reporting")
            assert time.monotonic() - stopped_at < 5 + 2  # within 5 s (+ the capture's own latency)
            assert re.search(r"NOT REPORTING: rank 1:\d+\.\ds", str(screen)), screen
            _wait(lambda: re.search(r"waiting: rank 0:\d+\.\ds", pane.text()), 20, "rank 0 shown waiting")
            clock = re.search(r"\d\d:\d\d:\d\d", pane.text().split("traceml live", 1)[1])
            time.sleep(2.5)  # the view keeps refreshing while a rank is stopped
            later = re.search(r"\d\d:\d\d:\d\d", pane.text().split("traceml live", 1)[1])
            assert clock and later and later[0] != clock[0]
        finally:
            os.kill(pid, signal.SIGCONT)
        _wait(lambda: "NOT REPORTING" not in pane.text() and "flags none" in pane.text(), 30, "recovery")

        final = _screen(pane, lambda s: "PANE-EXITED" in s, 300, "the end", history=300)
        assert "traceml-otel diagnosis" in str(final)
        assert "script line: rank 0 finished" in str(final) and "script line: rank 1 finished" in str(final)
    finally:
        pane.close()


def test_lines_through_a_pipe_and_top_on_a_running_then_finished_run(tmp_path: Path) -> None:
    env = _env(tmp_path, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--nproc-per-node", "2", "--run-id",
               "live-pipe", "--live-interval", "2", str(SCRIPT), "300", "0.05"]
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "runs" / "live-pipe"
    try:
        _wait(lambda: all((run_dir / f"rank-{r}.live.json").is_file() for r in (0, 1)), 180,
              "both live records")
        _wait(lambda: '"steps":0,' not in (run_dir / "rank-0.live.json").read_text(), 120, "a first step")
        top = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "top", str(run_dir), "--once",
                              "--lines"], env=env, capture_output=True, text=True, timeout=120)
        assert top.returncode == 0, top.stderr
        running = parse_line(top.stdout.strip())
        assert running["run"] == "live-pipe" and running["ranks"] == "2/2"
        stdout, stderr = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr
    assert "traceml: run live-pipe | folder" in stderr and f"traceml top {run_dir}" in stderr
    lines = [parse_line(line) for line in stdout.splitlines() if line.startswith("traceml-live ")]
    stepping = [fields for fields in lines if int(fields["steps"]) > 0]
    assert len(stepping) >= 3, stdout
    for fields in stepping:
        assert set(fields) >= {"t", "run", "ranks", "steps", "steps_per_s", "step_ms", "p95_ms", "fwd",
                               "bwd", "opt", "comm", "residual", "verdict", "silent", "waiting", "dropped"}
        assert float(fields["step_ms"]) > 40 and fields["fwd"].endswith("%")
    counts = [int(fields["steps"]) for fields in stepping]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    stamps = [time.strptime(fields["t"], "%H:%M:%S") for fields in lines]
    gaps = [(time.mktime(b) - time.mktime(a)) % 86400 for a, b in itertools.pairwise(stamps)]
    assert gaps and all(1 <= gap <= 4 for gap in gaps), gaps  # every 2 s (a loaded machine may slip a second)

    finished = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "top", str(run_dir)], env=env,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "ENDED" in finished.stdout and "steps 300" in finished.stdout, finished.stdout
