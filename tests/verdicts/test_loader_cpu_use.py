"""INPUT_BOUND's advice where the DataLoader's workers are as many as the CPUs beside the training loop:
the settings alone say the CPUs are the limit; the workers' measured CPU use (``rank-R.cpu.json``) says
whether they were computing (then it is) or waiting on reads (then more workers overlap the waits)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from tests.verdicts.runner import traceml_run
from traceml_otel.analyze.advice import worker_cpu_use
from traceml_otel.analyze.run_model import RankHost
from traceml_otel.wire.cpu_record import CpuRecord, read_cpu_record

small_machine = pytest.mark.skipif(len(os.sched_getaffinity(0)) > 8,
                                reason="one worker per CPU beside the loop: kept to small machines")


def _advice(run) -> tuple[str, dict]:  # type: ignore[no-untyped-def]
    primary = run.report["primary_diagnosis"]
    assert primary["kind"] == "INPUT_BOUND", primary
    evidence = {e["name"]: e["value"] for e in primary.get("evidence", [])}
    return " ".join(primary["next"].split()), evidence


def _machine_busy_s() -> float:
    """All CPUs' busy time so far (``/proc/stat``, seconds)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _children_readings(run) -> int:  # type: ignore[no-untyped-def]
    """How many of the rank's CPU samples hold a reading of its children's CPU (the workers')."""
    record = read_cpu_record(run.run_dir / "rank-0.cpu.json")
    return sum(1 for sample in record.samples if sample[6] >= 0)


@small_machine
def test_workers_that_wait_are_told_to_add_workers(tmp_path: Path) -> None:
    """Measured from the workers' own CPU time (the trainer's children), whatever else the machine ran.
    Where the kernel lists no children, the machine's busy time beside the training process stands in,
    and another job's load counts as the workers' (the settings' advice then stays): the test reads
    that load itself (the machine's busy time less the launch's whole process tree)."""
    busy, children, began = _machine_busy_s(), _children_cpu_s(), time.monotonic()
    run = traceml_run(tmp_path, "loader_cpu_use.py", "--steps", "150")
    others = (_machine_busy_s() - busy - (_children_cpu_s() - children)) / (time.monotonic() - began)
    advice, evidence = _advice(run)
    if _children_readings(run) >= 2 or others < 0.3:
        assert "CPUs are the limit" not in advice, advice
        assert "more workers overlap those waits" in advice, advice
        assert evidence["worker_cpu_use"] < 0.75, evidence
        assert "CPUs are the limit" not in run.stdout  # the printed diagnosis says the same
    else:  # other processes' CPU counted as the workers': the measured figure comes with the old advice
        assert ("more workers overlap those waits" in advice) == (evidence["worker_cpu_use"] < 0.75), advice


@small_machine
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_workers_that_compute_are_told_the_cpus_are_the_limit(tmp_path: Path, start_method: str) -> None:
    """Also where the workers are not the trainer's children but its forkserver's (Python 3.14's
    default start method on Linux): read as idle, they would be told to multiply."""
    run = traceml_run(tmp_path, "loader_cpu_use.py", "--steps", "150", "--computes", "--start-method",
                      start_method)
    advice, evidence = _advice(run)
    assert "CPUs are the limit (measured: each worker on a CPU or waiting for one" in advice, advice
    assert "more workers" not in advice, advice
    assert evidence["worker_cpu_use"] >= 0.75, evidence


def test_the_measure_is_left_out_where_it_cannot_tell() -> None:
    """Without the children's readings (a kernel that does not list them, an older record): the
    machine's busy time beside the trainer, for one rank only (ranks on nodes cannot be told apart),
    not for a process confined to fewer CPUs than its machine has, nor without workers."""
    samples = ((0, 0, 0, 0, 0, 0, -1, -1), (100, 10**9, 10**8, 0, 2 * 10**8, 3 * 10**8, -1, -1))
    one = CpuRecord("r", 0, "schedstat", samples, machine_cpus=2)
    host = RankHost(0, cpus=2, num_workers=1)
    assert worker_cpu_use([one], [host]) == pytest.approx(0.1)  # 0.3 CPU busy, 0.2 of it the trainer's
    assert worker_cpu_use([one, CpuRecord("r", 1, "schedstat", samples, machine_cpus=2)],
                          [host, RankHost(1, cpus=2, num_workers=1)]) is None
    assert worker_cpu_use([one], [RankHost(0, cpus=1, num_workers=1)]) is None  # taskset -c 0
    assert worker_cpu_use([one], [RankHost(0, cpus=2, num_workers=0)]) is None
    assert worker_cpu_use([CpuRecord("r", 0, "schedstat", samples[:1], machine_cpus=2)], [host]) is None


def test_the_childrens_readings_decide_per_rank_whatever_the_machine_did() -> None:
    """With the children's readings each rank's workers are measured (the median over ranks), however
    busy the machine was; time spent waiting for a CPU counts as wanted: two ranks of 2 workers each,
    1.6 and 0.4 CPUs' worth on a CPU, the second also 1.2 CPUs' worth waiting for one."""
    def record(rank: int, cpu_s: float, wait_s: float) -> CpuRecord:
        rows = [(10 * i, i * 10**8, 0, 0, 0, i * 2 * 10**8, -1, -1) for i in range(31)]
        for i in (0, 10, 20, 30):  # read about once a second
            rows[i] = (*rows[i][:6], int(cpu_s * i / 30 * 1e9), int(wait_s * i / 30 * 1e9))
        return CpuRecord("r", rank, "schedstat", tuple(rows), machine_cpus=2)

    hosts = [RankHost(0, cpus=2, num_workers=2), RankHost(1, cpus=2, num_workers=2)]
    assert worker_cpu_use([record(0, 3 * 1.6, 0)], hosts[:1]) == pytest.approx(0.8)
    assert worker_cpu_use([record(1, 3 * 0.4, 0)], hosts[1:]) == pytest.approx(0.2)
    assert worker_cpu_use([record(1, 3 * 0.4, 3 * 1.2)], hosts[1:]) == pytest.approx(0.8)
    assert worker_cpu_use([record(0, 3 * 1.6, 0), record(1, 3 * 0.4, 0)], hosts) == pytest.approx(0.5)
