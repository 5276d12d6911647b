"""The end-of-run diagnosis child starts with the job, waits beside it, and never outlives the launcher.

``traceml run`` starts its diagnosis process when the job starts (``cli/run_diagnosis.py``): it imports
the analyzer, then waits on its stdin for the run folder. These tests watch that process in
``/proc`` as a user's job runs, then do to it what a fault would: kill it mid-job (the diagnosis is still
printed, from a fresh child), and kill the launcher (the waiting child leaves too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.synthetic_runs import SyntheticStep, write_run

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"
CHILD = ["-c", "import sys; from traceml_otel.cli.run_diagnosis import diagnose_child; "
         "sys.exit(diagnose_child(sys.argv[1:]))"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    return env


def _launch(tmp_path: Path, *options: str, steps: int, sleep: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "traceml_otel.cli", "run", *options, str(STEADY), "--", "--steps", str(steps),
         "--sleep", str(sleep), f"--tag={tmp_path.name}"],
        env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def _waiting_children(launcher: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()
            and "run_diagnosis" in _cmdline(int(entry)) and "--wait" in _cmdline(int(entry))
            and _parent(int(entry)) == launcher]


def _find_waiting_child(launcher: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _waiting_children(launcher)
        if found:
            (pid,) = found
            return pid
        time.sleep(0.1)
    raise AssertionError("no waiting diagnosis process beside the job")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _cmdline(pid) == "":  # exited (or a zombie)
            return True
        time.sleep(0.1)
    return False


def _kill_tagged(tag: str) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit() and f"--tag={tag}" in _cmdline(int(entry)):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def test_a_waiting_diagnosis_killed_mid_job_is_replaced_and_the_report_printed(tmp_path: Path) -> None:
    process = _launch(tmp_path, steps=80, sleep=0.05)
    try:
        child = _find_waiting_child(process.pid)
        nice = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice == os.getpriority(os.PRIO_PROCESS, 0)  # only its import thread was niced
        os.kill(child, signal.SIGKILL)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
        _kill_tagged(tmp_path.name)
    assert process.returncode == 0, output[-3000:]
    assert "traceml-otel diagnosis" in output, output[-3000:]
    assert "could not diagnose" not in output, output[-3000:]


def test_the_waiting_diagnosis_leaves_with_a_killed_launcher(tmp_path: Path) -> None:
    process = _launch(tmp_path, steps=100_000, sleep=0.01)
    try:
        child = _find_waiting_child(process.pid)
        process.kill()  # SIGKILL: no finally, no handler runs in the launcher
        process.wait(timeout=30)  # (the orphaned job still holds the output pipe: not read to its end)
        assert _gone(child, timeout=30), _cmdline(child)
    finally:
        process.kill()
        _kill_tagged(tmp_path.name)
        if process.stdout is not None:
            process.stdout.close()


def test_no_report_starts_no_diagnosis_process(tmp_path: Path) -> None:
    process = _launch(tmp_path, "--no-report", steps=60, sleep=0.05)
    seen: list[int] = []
    try:
        while process.poll() is None:
            seen += _waiting_children(process.pid)
            time.sleep(0.1)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
        _kill_tagged(tmp_path.name)
    assert process.returncode == 0, output[-3000:]
    assert seen == []
    assert "traceml-otel diagnosis" not in output


def test_the_waiting_child_diagnoses_the_folder_it_is_handed_and_leaves_quietly_without_one(
    tmp_path: Path,
) -> None:
    run_dir = write_run(tmp_path / "run-a", "run-a", [SyntheticStep(rank=0, step=n) for n in range(20)])
    quiet = subprocess.run([sys.executable, *CHILD, "--wait", "4096"], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    request = json.dumps({"run_dir": str(run_dir), "html": False})
    handed = subprocess.run([sys.executable, *CHILD, "--wait", "4096"], input=request,
                            capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert handed.returncode == 0, handed.stderr
    assert handed.stdout.startswith("traceml-otel diagnosis"), handed.stdout
    assert (run_dir / "report.json").is_file()
