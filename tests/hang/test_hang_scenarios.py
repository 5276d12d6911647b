"""Hangs named while they happen and after the job is killed: real `traceml run` jobs, 2-rank gloo.

One module fixture launches every scenario at once (a 3 s hang-timeout floor) and, for each, waits
for the launcher's live ``traceml: HANG:`` line, then ends the job the way a scheduler does: SIGTERM
(then SIGKILL after a short grace, as Slurm or Kubernetes do, since a rank blocked inside a gloo
collective cannot run its SIGTERM handler) or SIGKILL straight away. ``traceml analyze`` must then name
the culprit rank and its ``file:line``. Two more jobs slow down or sit in a long ``outside_step``
block (rank 0 checkpointing while rank 1 waits for it in DDP's all-reduce) and must finish with no
hang reported.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.otlp_receiver import OtlpHttpReceiver, ReceivedSpan
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.report import render

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hang_train.py"
SOURCE = SCRIPT.read_text().splitlines()
LIVE_DEADLINE_S = 120.0  # generous: 2 shared cores start a dozen torch processes at once
GRACE_S = 4.0


def marker_line(marker: str) -> int:
    """The line of ``hang_train.py`` carrying ``# MARKER``."""
    return next(number for number, text in enumerate(SOURCE, 1) if f"# {marker}" in text)


@dataclass
class Scenario:
    name: str
    nproc: int
    kill: str  # "term", "kill", or "wait" (the job ends itself: --hang-action terminate)
    culprit: int
    marker: str
    extra_env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    mismatch: bool = False  # two ranks in different collectives: a tie, both are named
    receiver: OtlpHttpReceiver | None = None  # an OTLP backend for this job: the hang spans must reach it
    otlp_spans: list[ReceivedSpan] = field(default_factory=list)
    process: subprocess.Popen | None = None
    stderr: str = ""
    live_line: str = ""
    live_after_s: float | None = None
    runs: Path | None = None

    @property
    def key(self) -> str:
        return f"{self.name}-{self.nproc}"


SCENARIOS = [
    Scenario("sleep", 2, "term", 1, "HANG-SLEEP", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}),
    Scenario("broadcast", 2, "kill", 1, "HANG-BROADCAST", mismatch=True),
    # one extra all_reduce after the last step while rank 0 goes on to a barrier (gloo hangs there)
    Scenario("extra_barrier", 2, "kill", 1, "HANG-EXTRA-END", mismatch=True),
    Scenario("spin", 2, "kill", 1, "HANG-SPIN"),
    Scenario("loader", 1, "term", 0, "HANG-WORKER"),
    Scenario("generator", 1, "kill", 0, "HANG-GENERATOR"),
    Scenario("cspin", 1, "kill", 0, "HANG-CSPIN"),  # C code holding the GIL: faulthandler's dump
    # a C call that released the GIL (os.read on a pipe), ended by --hang-action terminate
    Scenario("cread", 1, "wait", 0, "HANG-CREAD", args=("--hang-action", "terminate")),
]
# one extra all_reduce of another size mid-training: gloo aborts the rank with the extra call (SIGABRT)
FAILING = [Scenario("extra", 2, "", 1, "", {"HANG_TEST_STEPS": "8"})]
HEALTHY = [
    Scenario("slowing", 1, "", 0, "", {"HANG_TEST_STEPS": "8"}),
    Scenario("checkpoint", 2, "", 0, "", {"HANG_TEST_STEPS": "8", "HANG_TEST_EVAL_S": "8"}),
]


def _env(runs: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(runs), PYTHONUNBUFFERED="1", TRACEML_HANG_TIMEOUT_S="3",
               TRACEML_SHUTDOWN_TIMEOUT_S="3", OMP_NUM_THREADS="1", **extra)
    return env


def _start(scenario: Scenario, root: Path) -> None:
    scenario.runs = root / scenario.key
    command = [sys.executable, "-m", "traceml_otel.cli", "run", "--nproc-per-node", str(scenario.nproc),
               "--no-report", *scenario.args, str(SCRIPT), scenario.name]
    scenario.process = subprocess.Popen(
        command, env=_env(scenario.runs, scenario.extra_env), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    os.set_blocking(scenario.process.stderr.fileno(), False)


def _read_stderr(scenario: Scenario) -> None:
    try:
        chunk = scenario.process.stderr.read()
    except (OSError, TypeError):
        chunk = None
    if chunk:
        scenario.stderr += chunk


def _kill_leftovers(runs: Path) -> None:
    """SIGKILL every process of this job, wherever it sits: torchrun starts ranks in their own
    sessions, DataLoader workers outlive a killed parent, and a rank that holds the GIL (or waits in a
    collective) never runs its SIGTERM handler. They carry the job's TRACEML_RUNS_DIR."""
    marker = f"TRACEML_RUNS_DIR={runs}".encode()
    for _ in range(3):
        found = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
            except (OSError, ProcessLookupError):
                continue
        if not found:
            return
        time.sleep(0.2)


def _otlp_hang_spans(scenario: Scenario) -> list[ReceivedSpan]:
    if scenario.receiver is None:
        return []
    return [span for span in scenario.receiver.spans() if span.name == "traceml.hang"]


def _end(scenario: Scenario) -> None:
    group = scenario.process.pid
    if scenario.kill == "wait":
        try:
            scenario.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    if scenario.kill == "term":
        os.killpg(group, signal.SIGTERM)
        try:
            scenario.process.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    scenario.process.wait(timeout=30)
    _read_stderr(scenario)
    _kill_leftovers(scenario.runs)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Scenario]:
    root = tmp_path_factory.mktemp("hangs")
    with_backend = SCENARIOS[0]  # sleep-2: both ranks' hang spans go to a real OTLP/HTTP receiver
    with_backend.receiver = OtlpHttpReceiver().start()
    with_backend.extra_env.update(OTEL_EXPORTER_OTLP_ENDPOINT=with_backend.receiver.endpoint,
                                  OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    for scenario in [*SCENARIOS, *FAILING, *HEALTHY]:
        _start(scenario, root)
    started = time.monotonic()
    pending = list(SCENARIOS)
    try:
        while pending and time.monotonic() - started < LIVE_DEADLINE_S:
            time.sleep(0.5)
            for scenario in list(pending):
                _read_stderr(scenario)
                found = re.search(r"^traceml: HANG: .*$", scenario.stderr, re.MULTILINE)
                if found or scenario.process.poll() is not None:
                    scenario.live_line = found.group(0) if found else ""
                    scenario.live_after_s = scenario.live_after_s or time.monotonic() - started
                    if found and scenario.receiver is not None and len(_otlp_hang_spans(scenario)) < 2:
                        continue  # the job is ended once both ranks' hang spans reached the backend
                    pending.remove(scenario)
                    _end(scenario)
        for scenario in [*FAILING, *HEALTHY]:
            scenario.process.wait(timeout=max(1.0, LIVE_DEADLINE_S - (time.monotonic() - started)))
            _read_stderr(scenario)
    finally:
        with_backend.otlp_spans = _otlp_hang_spans(with_backend)
        with_backend.receiver.stop()
        for scenario in [*SCENARIOS, *FAILING, *HEALTHY]:
            if scenario.process.poll() is None:
                os.killpg(scenario.process.pid, signal.SIGKILL)
                scenario.process.wait()
            _kill_leftovers(scenario.runs)
    return {scenario.key: scenario for scenario in [*SCENARIOS, *FAILING, *HEALTHY]}



def _analyze(runs: Path, fmt: str) -> str:
    (run_dir,) = runs.iterdir()
    command = [sys.executable, "-m", "traceml_otel.cli", "analyze", str(run_dir), "--format", fmt]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1, 3), result.stderr
    return result.stdout


@pytest.mark.parametrize("name", [s.key for s in SCENARIOS])
def test_the_launcher_names_the_culprit_and_its_line_while_the_job_hangs(jobs, name) -> None:
    scenario = jobs[name]
    where = f"hang_train.py:{marker_line(scenario.marker)}"
    assert scenario.live_line, f"no live HANG line; stderr:\n{scenario.stderr[-3000:]}"
    live = scenario.live_line
    assert f"rank {scenario.culprit} " in live and where in live, live
    if scenario.nproc == 2 and not scenario.mismatch:
        assert "rank 0 waits in all_reduce #" in live and "(DDP gradient sync)" in live, live
        waited = int(re.search(r"waits in all_reduce #\d+ \(DDP gradient sync\) for (\d+) s", live).group(1))
        assert waited <= 3 + 15, live  # named within the timeout (3 s floor here) plus 15 s, by its own clock


@pytest.mark.parametrize("name", [s.key for s in SCENARIOS])
def test_analyze_names_the_culprit_after_sigterm_or_sigkill(jobs, name) -> None:
    scenario = jobs[name]
    where = f"hang_train.py:{marker_line(scenario.marker)}"
    report = json.loads(_analyze(scenario.runs, "json"))
    hang = next(f for f in report["run_findings"] if f["kind"] == "HANG")
    evidence = {e["name"]: e["value"] for e in hang["evidence"]}
    if scenario.mismatch:  # a mismatch of two ranks: neither side is the majority, both are named
        assert evidence["culprit_ranks"] == "[0, 1]" and where in hang["why"], hang
        assert f"rank {scenario.culprit} entered" in hang["why"], hang
    else:
        assert evidence["culprit_rank"] == scenario.culprit and evidence["location"] == where, hang
    if scenario.nproc == 2 and not scenario.mismatch:
        assert evidence["waiting_ranks"] == "[0]", hang
    failed = [f for f in report["run_findings"] if f["kind"] == "RUN_FAILED"]
    for finding in failed:  # never blames the rank that only waited
        blamed = {e["name"]: e["value"] for e in finding["evidence"]}.get("failed_rank")
        assert blamed in (None, scenario.culprit), finding
    (run_dir,) = scenario.runs.iterdir()
    text = render(analyze_path([run_dir]), "text")  # in process: one CLI call per run is enough
    assert "HANG" in text and where in text


def test_the_culprits_emitter_wrote_a_hang_span_into_the_local_copy(jobs) -> None:
    from tests.local_copy_reader import read_run

    (run_dir,) = jobs["sleep-2"].runs.iterdir()
    hangs = [span for span in read_run(run_dir) if span.name == "traceml.hang"]
    culprit = [span for span in hangs if span.attributes["traceml.rank"] == 1]
    assert culprit and culprit[0].attributes["traceml.hang.location"].endswith(
        f"hang_train.py:{marker_line('HANG-SLEEP')}")
    assert any(span.attributes["traceml.phase.name"] == "collective" for span in hangs)  # rank 0 waits


def test_every_ranks_hang_span_carries_the_verdict_to_an_otlp_backend(jobs) -> None:
    """The cross-rank verdict reaches any OTLP backend, not only the launcher's stderr."""
    scenario = jobs["sleep-2"]
    where = f"hang_train.py:{marker_line('HANG-SLEEP')}"
    by_rank = {span.attributes["traceml.rank"]: span.attributes for span in scenario.otlp_spans}
    assert sorted(by_rank) == [0, 1], scenario.otlp_spans
    for rank, attributes in by_rank.items():
        verdict = attributes["traceml.hang.verdict"]
        assert verdict.startswith(f"rank 1 is stuck in user code at {where}"), verdict
        assert "rank 0 waits in all_reduce #" in verdict, verdict
        assert attributes["traceml.hang.culprit_ranks"] == [1]
        assert attributes["traceml.hang.culprit_location"] == where
        assert attributes["traceml.hang.waiting_ranks"] == [0]
        assert attributes["traceml.hang.culprit"] is (rank == 1)


def test_the_flight_recorder_is_dumped_beside_the_hang_record_when_enabled(jobs) -> None:
    (run_dir,) = jobs["sleep-2"].runs.iterdir()  # TORCH_NCCL_TRACE_BUFFER_SIZE=64; gloo records too
    dump = json.loads((run_dir / "rank-0.flight-recorder.json").read_text())
    assert any("all_reduce" in entry.get("profiling_name", "") for entry in dump["entries"])
    record = json.loads((run_dir / "rank-0.hang.json").read_text())
    assert record["flight_recorder"] == "flight recorder in rank-0.flight-recorder.json"
    assert not list(jobs["generator-1"].runs.glob("*/rank-*.flight-recorder.json"))  # not enabled there


def test_an_extra_all_reduce_at_the_end_against_a_barrier_names_both_calls(jobs) -> None:
    live = jobs["extra_barrier-2"].live_line
    assert live.startswith("traceml: HANG: collective mismatch: "), live
    assert "entered barrier #" in live and f"hang_train.py:{marker_line('HANG-BARRIER')}" in live, live


def test_an_extra_all_reduce_mid_training_is_a_gloo_abort_and_run_failed_names_that_rank(jobs) -> None:
    scenario = jobs["extra-2"]
    assert scenario.process.returncode == 134, scenario.stderr[-3000:]  # 128 + SIGABRT, in seconds
    assert "Is there a distributed collective mismatch" in scenario.stderr  # gloo's own words, rank 1
    assert "HANG" not in scenario.stderr
    report = json.loads(_analyze(scenario.runs, "json"))
    (failed,) = [f for f in report["run_findings"] if f["kind"] == "RUN_FAILED"]
    assert failed["title"] == "The run failed: rank 1 crashed (SIGABRT)", failed
    assert {e["name"]: e["value"] for e in failed["evidence"]}["failed_rank"] == 1
    assert not [f for f in report["run_findings"] if f["kind"] == "HANG"]


def test_a_mismatch_names_both_calls_and_html_shows_the_hang(jobs) -> None:
    scenario = jobs["broadcast-2"]
    assert "collective mismatch" in scenario.live_line
    assert f"hang_train.py:{marker_line('HANG-ALLREDUCE')}" in scenario.live_line  # rank 0's side of it
    (run_dir,) = scenario.runs.iterdir()
    html = render(analyze_path([run_dir]), "html")
    assert "HANG" in html and f"hang_train.py:{marker_line('HANG-BROADCAST')}" in html


@pytest.mark.parametrize("name", [s.key for s in HEALTHY])
def test_slow_but_moving_steps_and_long_outside_step_work_are_no_hang(jobs, name) -> None:
    scenario = jobs[name]
    assert scenario.process.returncode == 0, scenario.stderr[-3000:]
    assert "HANG" not in scenario.stderr and "no progress" not in scenario.stderr
    (run_dir,) = scenario.runs.iterdir()
    assert not list(run_dir.glob("rank-*.hang.json")) and not list(run_dir.glob("rank-*.outside.json"))


def test_hang_action_terminate_ends_the_job_with_its_exit_code_once_the_record_is_written(jobs) -> None:
    scenario = jobs["cread-1"]
    assert scenario.process.returncode == 75, scenario.stderr[-3000:]
    assert "--hang-action terminate: ending the job (exit code 75)" in scenario.stderr
    (run_dir,) = scenario.runs.iterdir()
    record = json.loads((run_dir / "rank-0.hang.json").read_text())
    assert record["state"] == "hung" and record["location"]["line"] == marker_line("HANG-CREAD")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["exit_code"] == 75 and "hang-action terminate" in manifest["end_status"]


def test_a_c_loop_holding_the_gil_is_named_from_faulthandlers_dump(jobs) -> None:
    (run_dir,) = jobs["cspin-1"].runs.iterdir()
    assert not (run_dir / "rank-0.hang.json").exists()  # the watchdog thread never ran
    assert "Timeout (" in (run_dir / "rank-0.hang-traceback.txt").read_text()
