"""Goodput end to end: runs with known time in each category, on 1 rank (direct launch) and 2 ranks
(``traceml run``), started together and shared by every assertion (about 30 s of wall time).

The script measures its own evaluation, checkpoint, stall and between-steps time and when it asked
for its first batch; the test measures the launch and exit. Each category must be within 5 % of that
truth, and the categories must add up to the rank's wall time within 2 %. MFU rides on the same runs:
a stack of ``Linear`` layers with gradient accumulation 4 declares its analytic FLOPs on every step
and has one step measured with ``FlopCounterMode``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from tests.ports import free_port
from traceml_otel.analyze.mfu import rank_mfu
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.analyze.time_accounting import PRODUCTIVE, read_time_records
from traceml_otel.report import render

SCRIPT = Path(__file__).parent / "scripts" / "known_times.py"
KNOWN = {"KNOWN_STARTUP": "2", "KNOWN_EVALUATION": "3", "KNOWN_CHECKPOINT": "1", "KNOWN_BETWEEN": "1",
         "KNOWN_STALL": "6", "KNOWN_SHUTDOWN": "1"}


def _env(tmp: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    # The hang timeout is max(floor, factor x the longest recent step interval). At the default factor
    # (5), one step interval of a second (the suite's other worker starving this run) lifted it to the
    # 5 s stall this run once had, and no stall was seen (CI: "rank 0 stalled: 0.000 s vs 5.000 s"; a
    # live record was once written 4.9 s in). Factor 3 and a 6 s stall leave room for 2 s intervals.
    env.update(KNOWN, TRACEML_RUNS_DIR=str(tmp / name), TRACEML_HANG_TIMEOUT_S="1", TRACEML_HANG_FACTOR="3",
               TRACEML_PEAK_FLOPS="1e12",
               KNOWN_TIMES_OUT=str(tmp / f"{name}-truth"), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("goodput")
    commands = {
        "one": [sys.executable, str(SCRIPT)],
        # --no-report: the launcher's end-of-run diagnosis comes after the ranks' lives
        "two": [sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", "--nproc-per-node", "2",
                str(SCRIPT)],
    }
    started = {}
    port = free_port()
    scrapes = _Scraper(port)  # the one-rank run's direct scrape endpoint: the live time counters
    for name, command in commands.items():
        env = _env(tmp, name)
        if name == "one":
            env.update(TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="2")
        else:
            # Two ranks on a CPU shared with another test worker: with a 1 s hang timeout a rank starved
            # for a second was once declared stalled after the real stall (CI, when a record kept
            # only its last episode: "rank 0 stalled: 1.005 s vs 5.000 s"; every episode counts now, so
            # it would read 6 s). 2 s still sees the stall; the one-rank run keeps 1 s, whose 0.2 s
            # tick its live counters are checked at.
            env.update(TRACEML_HANG_TIMEOUT_S="2")
        log = (tmp / f"{name}.log").open("w")  # a file, not a pipe: a full pipe would stall the run
        started[name] = (time.time(), subprocess.Popen(command, env=env, stdout=log,
                                                       stderr=subprocess.STDOUT, text=True))
    scrapes.start()
    ended_at: dict[str, float] = {}
    deadline = time.monotonic() + 180
    while len(ended_at) < len(started) and time.monotonic() < deadline:  # each run's own end time
        for name, (_, process) in started.items():
            if name not in ended_at and process.poll() is not None:
                ended_at[name] = time.time()
        time.sleep(0.05)
    scrapes.stop()
    results = {}
    for name, (launched, process) in started.items():
        process.wait(timeout=5)
        output = (tmp / f"{name}.log").read_text()
        ended = ended_at[name]
        assert process.returncode == 0, output
        run_dir = next((tmp / name).iterdir())
        truths = {int(p.name.rsplit("rank-", 1)[1].split(".")[0]): json.loads(p.read_text())
                  for p in tmp.glob(f"{name}-truth.rank-*.json")}
        results[name] = {"launched": launched, "ended": ended, "run_dir": run_dir, "truth": truths,
                         "analysis": analyze_path([run_dir])}
    results["one"]["live"] = scrapes.last
    return results


class _Scraper(threading.Thread):
    """Scrapes one endpoint every 0.25 s and keeps the last time counters it saw (the final ones
    come during the end's linger)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.last: dict[str, float] = {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.25):
            try:
                text = urllib.request.urlopen(self.url, timeout=2).read().decode()
            except OSError:
                continue
            seen = {m[1]: float(m[2]) for m in _TIME_LINE.finditer(text)}
            if seen:
                self.last = seen

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


_TIME_LINE = re.compile(
    r'^traceml_time_seconds_total\{[^}]*traceml_time_category="([^"]+)"[^}]*\} (\S+)$', re.M)


def _near(measured: float, truth: float, tolerance: float = 0.05) -> bool:
    return abs(measured - truth) <= tolerance * truth


HANG_FLOOR_S = {"one": 1.0, "two": 2.0}  # each run's TRACEML_HANG_TIMEOUT_S (see runs())
STALL_STEP = 12  # the script's stalled step


def _stall_bounds(run: dict, name: str, rank: int) -> tuple[float, float]:
    """The stalled time the truth allows: the script's stall, up to every other step or gap between
    steps that itself ran past the hang floor, each with 5 %. A loaded machine starving step 0 or the
    FlopCounterMode step 1 for 1.2 s is, to the watchdog, no progress for longer than its timeout (CI
    once read "rank 0 stalled: 7.239 s vs 6.000 s")."""
    truth = run["truth"][rank]
    quiet = [s for index, s in enumerate(truth["step_seconds"]) if index != STALL_STEP] + truth["gap_seconds"]
    starved = sum(seconds for seconds in quiet if seconds > HANG_FLOOR_S[name])
    return 0.95 * truth["stall"], 1.05 * (truth["stall"] + starved)


@pytest.mark.parametrize("name, ranks", [("one", 1), ("two", 2)])
def test_each_category_within_5_percent_and_sum_is_wall(runs: dict[str, dict], name: str, ranks: int) -> None:
    run = runs[name]
    account = run["analysis"].time_account
    assert account is not None and len(account.ranks) == ranks
    for rank_time in account.ranks:
        truth = run["truth"][rank_time.rank]
        got = dict(rank_time.categories)
        checks = {
            "startup": (got["startup"], truth["first_fetch"] - run["launched"]),
            "evaluation": (got["outside.evaluation"], truth["evaluation"]),
            "checkpoint": (got["outside.checkpoint"], truth["checkpoint"]),
            "between steps": (got["between_steps"], truth["between"]),
        }
        for label, (measured, expected) in checks.items():
            where = f"rank {rank_time.rank} {label}: {measured:.3f} s vs {expected:.3f} s"
            assert _near(measured, expected), where
        low, high = _stall_bounds(run, name, rank_time.rank)
        assert low <= got["stalled"] <= high, (
            f"rank {rank_time.rank} stalled: {got['stalled']:.3f} s vs {truth['stall']:.3f} s "
            f"(allowed {low:.3f}-{high:.3f} s; steps {[round(s, 2) for s in truth['step_seconds']]})")
        assert got["shutdown"] >= 0.95 * float(KNOWN["KNOWN_SHUTDOWN"])
        assert got["startup"] >= float(KNOWN["KNOWN_STARTUP"])
        total = sum(got.values())
        assert _near(total, rank_time.wall_s, 0.02)
        # Seen from outside, the process also forks before its start and tears the interpreter down
        # after its last record (torch: 1-2 s on a loaded machine; the launcher's own exit for
        # traceml run): invisible from inside, so only a loose bound here (docs/goodput.md). On a
        # saturated machine that tail took 5 s of a 33 s run (0.85 failed); a missing category of
        # the run's own (its 9 s start-up) would still fall far below 0.75.
        outside_wall = run["ended"] - run["launched"]
        assert outside_wall * 0.75 <= rank_time.wall_s <= outside_wall + 0.05, (rank_time, outside_wall)


def test_the_live_time_counters_match_the_known_times(runs: dict[str, dict]) -> None:
    """The emitter's traceml_time_seconds_total (the direct scrape path) of the one-rank run, read at its
    end: each category within 5 % of the truth, and they add up to the analyzer's wall time less the
    part after telemetry's end that only the analyzer sees (its shutdown is longer by that part), and
    telemetry's own time at the end, which the analyzer alone bills."""
    run = runs["one"]
    live = run["live"]
    truth = run["truth"][0]
    checks = {
        "startup": (live.get("startup", 0.0), truth["first_fetch"] - run["launched"]),
        "evaluation": (live.get("outside.evaluation", 0.0), truth["evaluation"]),
        "checkpoint": (live.get("outside.checkpoint", 0.0), truth["checkpoint"]),
        "between steps": (live.get("between_steps", 0.0), truth["between"]),
    }
    for label, (measured, expected) in checks.items():
        assert _near(measured, expected), f"live {label}: {measured:.3f} s vs {expected:.3f} s ({live})"
    (rank,) = run["analysis"].time_account.ranks
    got = dict(rank.categories)
    # The live stall comes from the watchdog's record (1 s timeout, 0.2 s tick). With the suite's other
    # worker on the 2 cores its record was once written 4.9 s into the 5 s stall (CI: live stalled
    # 0.116 s, the rest still in the step block): then the stall is billed late. A short stall whose
    # record the emitter read only after its step's row (a starved step 0 past the 1 s floor) stays
    # step time live: counters only grow, so time already billed is never moved. No time is lost or
    # counted twice either way: the live stall and step time add up to the analyzer's, which bills
    # each stall exactly.
    stalled, block = live.get("stalled", 0.0), live["step.block"]
    productive = sum(v for k, v in got.items() if k in PRODUCTIVE)
    low, high = _stall_bounds(run, "one", 0)
    assert stalled > 0 and (stalled < low or stalled <= high), (
        f"live stalled: {stalled:.3f} s vs {truth['stall']:.3f} s (allowed {low:.3f}-{high:.3f} s; {live})")
    assert _near(stalled + block, got["stalled"] + productive, 0.05), (stalled, block, got)
    assert live["shutdown"] >= 0.95 * float(KNOWN["KNOWN_SHUTDOWN"])
    # telemetry's own time at the end (the final export, the endpoint's 2-s linger) is the analyzer's
    # only: it comes after the emitter's final counts
    assert _near(sum(live.values()) - live["shutdown"],
                 rank.wall_s - got["shutdown"] - got.get("telemetry", 0.0), 0.02)
    # goodput's numerator, the same both ways when both billed the same stall: ~0.1 s of tiny steps
    # here, so 5 % is 5 ms, and a loaded machine moved it 7 ms once (91 vs 98 ms at load 12; it passed
    # at load 3); the live counters are sampled as the run goes, so a step or two may shift: 0.15 s floor
    if _near(stalled, got["stalled"]):
        assert abs(block - productive) <= max(0.1 * productive, 0.15)


def test_findings_name_the_dominant_categories(runs: dict[str, dict]) -> None:
    account = runs["two"]["analysis"].time_account
    texts = [f.text for f in account.findings]
    assert any(t.startswith("stalled time takes") for t in texts), texts
    assert all(f.share >= 0.10 and f.category not in PRODUCTIVE for f in account.findings)
    assert account.goodput is not None and 0 < account.goodput < 0.2


def test_report_formats_show_the_section(runs: dict[str, dict]) -> None:
    analysis = runs["one"]["analysis"]
    text = render(analysis, "text")
    assert "Where the job's time went" in text and "evaluation" in text and "MFU " in text
    document = json.loads(render(analysis, "json"))
    names = {c["name"] for c in document["time_accounting"]["categories"]}
    assert {"startup", "outside.evaluation", "outside.checkpoint", "stalled", "shutdown"} <= names
    assert document["mfu"]["ranks"][0]["source"] == "declared"
    html = render(analysis, "html")
    assert "time went</h2>" in html and "<svg" in html


@pytest.mark.parametrize("name", ["one", "two"])
def test_mfu_measured_equals_analytic_and_declared(runs: dict[str, dict], name: str) -> None:
    run = runs[name]
    records, problems = read_time_records(run["run_dir"])
    assert not problems
    mfu = run["analysis"].mfu
    assert mfu is not None and mfu.mfu is not None and 0 < mfu.mfu <= 1
    for rank, record in records.items():
        analytic = run["truth"][rank]["flops_per_step"]
        assert record.flops.measured is not None and _near(record.flops.measured, analytic, 0.02)
        declared = next(r for r in mfu.ranks if r.rank == rank)
        assert declared.source == "declared" and declared.mfu is not None
        # The same run with only the measurement (no declaration): the same MFU within 2 % (the
        # measured step, slowed by counting, is left out of the timing either way).
        only_measured = replace(record, flops=replace(record.flops, declared_sum=None, declared_steps=0))
        steps = [s for s in _steps(run["run_dir"]) if s.rank == rank]
        measured = rank_mfu(rank, steps, only_measured)
        assert measured is not None and measured.source == "measured" and measured.mfu is not None
        assert _near(measured.mfu, declared.mfu, 0.02), (measured.mfu, declared.mfu)


def _steps(run_dir: Path) -> list:
    from traceml_otel.analyze.sources.files import FileSpanSource

    return list(FileSpanSource([run_dir]).load().steps)


def test_compare_shows_the_goodput_change(runs: dict[str, dict]) -> None:
    from traceml_otel.analyze.compare_policy import compare_runs
    from traceml_otel.report.compare_report import render_comparison_json, render_comparison_text
    from traceml_otel.report.run_summary import summary_from_report

    a, b = (summary_from_report(json.loads(render(runs[n]["analysis"], "json")), n) for n in ("one", "two"))
    assert a.goodput == runs["one"]["analysis"].time_account.goodput and b.mfu is not None
    comparison = compare_runs(a, b)
    text = render_comparison_text(comparison)
    line = next(line for line in text.splitlines() if line.startswith("goodput"))
    assert f"{(b.goodput - a.goodput) * 100:+.1f} points" in line
    assert json.loads(render_comparison_json(comparison))["b"]["goodput"] == b.goodput
