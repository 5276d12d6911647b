"""``traceml analyze --prometheus`` reads how a run ended, as the local copy does: a real Prometheus
scrapes three real 2-rank jobs under ``traceml run`` (a hang in rank 1's step, ended by
``--hang-action terminate``; rank 1 raising in its step; rank 1 SIGKILLed, named by the launcher)
and both readers must give the same HANG / RUN_FAILED finding with the same rank. A mistyped run id
lists the nearest ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port, free_port_pair
from tests.prometheus_server import running_prometheus, static_targets
from tests.tools import requires_tool
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
HANG_SCRIPT = REPO / "tests" / "hang" / "scripts" / "hang_train.py"
KILLED_SCRIPT = REPO / "tests" / "launch" / "scripts" / "killed_rank.py"
pytestmark = requires_tool("prometheus")
CRASH = """
import os, time
import torch
import traceml_otel as traceml
traceml.init()
model = torch.nn.Linear(4, 1)
for step in range(400):
    with traceml.trace_step(model):
        model(torch.ones(8, 4)).sum().backward()
        if step == 30 and os.environ.get("RANK") == "1":
            raise ValueError("bad batch")
    time.sleep(0.01)
"""


@dataclass
class Runs:
    url: str
    local: dict[str, dict]
    run_ids: dict[str, str]


def _launch(tmp: Path, name: str, port: int, args: list[str], extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp / name), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="4", **extra)
    return subprocess.Popen([sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", f"{name}-run",
                             "--nproc-per-node", "2", *args], env=env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("prometheus-failures")
    (tmp / "crash.py").write_text(textwrap.dedent(CRASH))
    ports = {"hung": free_port_pair(), "crashed": free_port_pair(), "killed": free_port_pair()}
    endpoints = [p + r for p in ports.values() for r in (0, 1)]
    with running_prometheus(tmp, [static_targets("traceml", [f"127.0.0.1:{p}" for p in endpoints])],
                            port=free_port(avoid=tuple(endpoints))) as server:
        launched = {
            "hung": _launch(tmp, "hung", ports["hung"], ["--hang-action", "terminate", str(HANG_SCRIPT),
                                                         "--", "sleep", "20"],
                            {"TRACEML_HANG_TIMEOUT_S": "3", "HANG_TEST_STEPS": "400"}),
            "crashed": _launch(tmp, "crashed", ports["crashed"], [str(tmp / "crash.py")], {}),
            "killed": _launch(tmp, "killed", ports["killed"], [str(KILLED_SCRIPT), "1", "30", "100000"], {}),
        }
        local, run_ids = {}, {}
        for name, proc in launched.items():
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode != 0, out
            run_ids[name] = f"{name}-run"
            local[name] = json.loads((tmp / name / run_ids[name] / "report.json").read_text())

        def ends_stored() -> bool:
            ended = server.query("count by (traceml_run_id) (last_over_time(traceml_run_ended[10m]))")
            return {r["metric"]["traceml_run_id"] for r in ended} >= set(run_ids.values())

        wait_for(ends_stored, 30, "the runs did not reach Prometheus", server.log)
        yield Runs(server.url, local, run_ids)


def _analyze(url: str, run_id: str, capsys: pytest.CaptureFixture[str], fmt: str = "json") -> tuple[int, str]:
    from traceml_otel.cli.entry import main

    code = main(["analyze", "--prometheus", url, "--run-id", run_id, "--since", "30m", "--format", fmt,
                 "--timeout", "10"])
    return code, capsys.readouterr().out


def _finding(report: dict, kind: str) -> dict[str, object] | None:
    found = next((f for f in report["run_findings"] if f["kind"] == kind), None)
    return None if found is None else {e["name"]: e["value"] for e in found["evidence"]}


def test_a_hung_run_reads_as_hang_with_its_culprit_on_both(runs: Runs, capsys) -> None:
    code, out = _analyze(runs.url, runs.run_ids["hung"], capsys)
    assert code == 0, out
    metrics, local = _finding(json.loads(out), "HANG"), _finding(runs.local["hung"], "HANG")
    assert local is not None and metrics is not None, (runs.local["hung"]["run_findings"], out)
    assert metrics["culprit_rank"] == local["culprit_rank"] == 1


def test_a_crashed_run_reads_as_run_failed_with_its_rank_on_both(runs: Runs, capsys) -> None:
    code, out = _analyze(runs.url, runs.run_ids["crashed"], capsys)
    assert code == 0, out
    metrics, local = _finding(json.loads(out), "RUN_FAILED"), _finding(runs.local["crashed"], "RUN_FAILED")
    assert local is not None and metrics is not None, (runs.local["crashed"]["run_findings"], out)
    assert metrics["failed_rank"] == local["failed_rank"] == 1
    assert metrics["exception_type"] == local["exception_type"] == "ValueError"


def test_a_killed_rank_reads_as_run_failed_naming_it_on_both(runs: Runs, capsys) -> None:
    code, out = _analyze(runs.url, runs.run_ids["killed"], capsys)
    assert code == 0, out
    metrics, local = _finding(json.loads(out), "RUN_FAILED"), _finding(runs.local["killed"], "RUN_FAILED")
    assert local is not None and metrics is not None, (runs.local["killed"]["run_findings"], out)
    assert metrics["failed_rank"] == local["failed_rank"] == 1
    assert metrics["exception_type"] == local["exception_type"] == "SIGKILL"


def test_a_wrong_run_id_lists_the_nearest_ones(runs: Runs, capsys) -> None:
    _, out = _analyze(runs.url, "hung-rnu", capsys, fmt="text")
    assert "nearest run ids" in out and "'hung-run'" in out, out
