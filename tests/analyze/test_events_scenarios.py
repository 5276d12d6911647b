"""Stalls, straggler recurrence and segments on real DDP (gloo) jobs under ``traceml run``.

Each test launches ``tests/analyze/scripts/events_train.py`` with torchrun's ``--nproc-per-node`` and
reads the ``report.json`` the run leaves. The planted effects are sleeps inside the traced step; the
base step is 60 ms so that a loaded machine's scheduling delays (a few ms) stay well under the
straggler threshold (10 % of the step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "analyze" / "scripts" / "events_train.py"
STALL_S = 8.0


def launch(tmp_path: Path, scenario: str, ranks: int, **env_extra: str) -> tuple[dict, str]:
    """Run the scenario under ``traceml run``; its report and stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "EVENTS_"))}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1", PYTHONPATH=path,
               EVENTS_BASE_S="0.06", EVENTS_SLOW_S="0.06", EVENTS_STEPS="150", EVENTS_WINDOW="15",
               TRACEML_CAPTURE_AUTO="0")  # stalls, stragglers, segments: no deep captures (tests/capture)
    env.update(env_extra)
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(SCRIPT), "--nproc-per-node", str(ranks), "--",
         scenario],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return json.loads((run_dir / "report.json").read_text()), result.stdout


def _stall_line() -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "# EVENTS-STALL" in line)


@pytest.mark.parametrize("watchdog", ["fires", "off"])
def test_a_resolved_stall_is_an_event_on_rank_one_billed_to_stalled_and_no_straggler(
    tmp_path: Path, watchdog: str
) -> None:
    timeout = "2" if watchdog == "fires" else "0"  # 0 turns the hang watchdog off
    report, stdout = launch(tmp_path, "stall", 2, TRACEML_HANG_TIMEOUT_S=timeout, EVENTS_STALL_S=str(STALL_S),
                            EVENTS_STEPS="60", EVENTS_BASE_S="0.01")
    (event,) = report["stalls"]["events"]
    assert event["ranks"] == [1] and event["waiting_ranks"] == [0] and event["step"] == 30
    assert abs(event["seconds"] - STALL_S) <= 1.0
    if watchdog == "fires":
        assert event["kind"] == "HANG" and event["resolved"]
        assert event["location"] == f"events_train.py:{_stall_line()}"
    else:
        assert event["kind"] == "STALL"
    kinds = [f["kind"] for f in report["run_findings"]]
    assert event["kind"] in kinds
    # The stall is not a straggler: billed to the straggler rule, 8 s over 60 steps of 10 ms would score
    # far above 1. On a loaded machine one rank's sub-millisecond compute can trail the other's by the
    # warning's 10 % of a step, a true (small) straggler of the machine's making, not of the stall.
    stragglers = [f for f in report["issues"] if f["kind"].endswith("STRAGGLER")]
    assert all(f["score"] < 0.5 for f in stragglers), stragglers
    account = report["time_accounting"]
    for rank in account["ranks"]:
        seconds = {c["name"]: c["seconds"] for c in rank["categories"]}
        assert abs(seconds["stalled"] - STALL_S) <= 1.0, (rank["rank"], seconds)
        productive = sum(v for k, v in seconds.items() if k in account["productive"])
        assert productive < STALL_S / 2, seconds  # the stall is not productive time
    for pointer in [f["advice"] for f in account["findings"] if f["category"] == "stalled"]:
        for kind in ("STALL", "HANG"):  # a text that points at a finding finds it
            assert (kind in pointer) == (kind in kinds), (pointer, kinds)
    assert "STALL" in stdout or "HANG" in stdout


@pytest.mark.parametrize(("pattern", "ranks"), [
    ("chronic", 2), ("chronic", 4), ("rotating", 2), ("rotating", 4), ("transient", 4), ("onset", 2)])
def test_straggler_recurrence_is_classified(tmp_path: Path, ranks: int, pattern: str) -> None:
    report, stdout = launch(tmp_path, pattern, ranks)
    recurrence = report["straggler_recurrence"]
    if pattern == "onset":  # slow from step 75 (window 5 of 10) to the end: chronic since then, not passing
        assert recurrence["pattern"] == "chronic", recurrence
        assert abs(recurrence["since_step"] - 75) <= 15 and recurrence["culprits"][-1] == 1, recurrence
        assert "chronic since step" in stdout and "likely a passing event" not in stdout
        return
    assert recurrence["pattern"] == pattern, recurrence
    assert recurrence["since_step"] is None or pattern != "chronic", recurrence
    culprits = recurrence["culprits"]
    if pattern == "chronic":
        assert recurrence["counts"][0]["rank"] == 1
    elif pattern == "rotating":  # window w is slow on rank w % ranks
        right = sum(1 for w, c in enumerate(culprits) if c == w % ranks)
        assert right >= 0.7 * len(culprits), culprits
    else:
        assert culprits[2] == 1, culprits
    stragglers = [f for f in report["issues"] if f["kind"].endswith("STRAGGLER")]
    for finding in stragglers:
        assert {e["name"]: e["value"] for e in finding["evidence"]}["recurrence"] == pattern


def test_compile_steady_then_slower_third_gives_three_segments_on_a_real_job(tmp_path: Path) -> None:
    report, stdout = launch(tmp_path, "phases", 2)
    found = report["segments"]
    segments = found["segments"]
    assert [s["label"] for s in segments] == ["warm-up", "steady", "slow period"], segments
    for seg, (first, last) in zip(segments, [(0, 9), (10, 99), (100, 149)], strict=True):
        assert abs(seg["first_step"] - first) <= 8 and abs(seg["last_step"] - last) <= 8  # 5 % of 150 steps
    steady = segments[found["reference"]]
    assert steady["label"] == "steady"
    assert report["primary_diagnosis"]["kind"] == steady["verdict"]
    assert 0.25 <= segments[2]["change"] <= 0.6
    assert "Segments" in stdout
    # step 0's one-off compile (80 base steps) is start-up: left out of the means, said under the header
    window = report["window"]
    assert (window["startup_steps"], window["startup_last_step"]) == (1, 0), window
    assert "start-up: step 0 took" in stdout


@pytest.mark.parametrize("hog", [False, True])
def test_a_healthy_job_has_one_segment_and_no_stall(tmp_path: Path, hog: bool) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
    try:
        report, _ = launch(tmp_path, "healthy", 2)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    assert len(report["segments"]["segments"]) == 1, report["segments"]["segments"]
    assert report["stalls"]["events"] == []
