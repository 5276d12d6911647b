"""The training thread's CPU samples, read from the emitter's process: the thread named by the time
record, each sample's step count from the step rows that cover it, bounded, written atomically."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from traceml_otel.emit import trainer_cpu
from traceml_otel.emit.trainer_cpu import (
    TrainerCpuSampler,
    read_children_cpu,
    read_process_cpu,
    read_thread_cpu,
)
from traceml_otel.wire.cpu_record import read_cpu_record
from traceml_otel.wire.time_record import TimeRecord, write_time_record


def _name_thread(run_dir: Path, rank: int, tid: int | None) -> None:
    write_time_record(run_dir, TimeRecord(rank, "run-x", training_tid=tid))


def _row(end_ns: int) -> list[object]:
    return [0, end_ns - 1000, end_ns]  # step, start, end: the fields the sampler reads


def test_samples_follow_the_named_thread_and_the_steps_that_ended_before_them(tmp_path: Path) -> None:
    _name_thread(tmp_path, 3, threading.get_native_id())
    sampler = TrainerCpuSampler(tmp_path, 3, "run-x", os.getpid(), print, interval_s=0.01)
    ends: list[int] = []
    batch: list[list[object]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(sampler.samples) < 8:  # this thread is the trainer
        sum(range(20_000))
        ends.append(time.perf_counter_ns())
        batch.append(_row(ends[-1]))
        sampler.tick()
        if len(batch) == 7:  # rows arrive in batches, after the samples that they cover
            sampler.steps(batch)
            batch = []
    sampler.steps(batch)
    sampler.close()
    record = read_cpu_record(tmp_path / "rank-3.cpu.json")
    assert record.run_id == "run-x" and record.rank == 3 and record.source in ("schedstat", "stat")
    assert len(record.samples) >= 8
    for steps, at, *_ in record.samples:
        assert steps == sum(1 for end in ends if end <= at) and at <= ends[-1]  # none after the last step
    steps, clocks, on_cpu = ([s[i] for s in record.samples] for i in range(3))
    assert steps == sorted(steps) and steps[-1] <= len(ends)
    assert clocks == sorted(clocks) and on_cpu == sorted(on_cpu) and on_cpu[-1] > on_cpu[0]


def test_step_counts_come_from_the_rows_that_cover_each_sample(tmp_path: Path, monkeypatch) -> None:
    """A fake clock and fixed counters: samples at 10, 20, 30 and 40 ns; steps end at 5, 15, 25 and 35."""
    monkeypatch.setattr(trainer_cpu, "read_thread_cpu", lambda pid, tid: ("schedstat", 1, 0))
    clock = [0]
    sampler = TrainerCpuSampler(None, 0, "r", 1, print, interval_s=1e-9, clock=lambda: clock[0])
    sampler.tid = 42
    for at in (10, 20):
        clock[0] = at
        sampler.tick()
    sampler.steps([_row(5), _row(15)])  # covers 10; 20 waits for a row after it
    clock[0] = 30
    sampler.tick()
    sampler.steps([_row(25), _row(35)])  # covers 20 and 30
    clock[0] = 40
    sampler.tick()  # after the last row seen: waits
    assert [(s[0], s[1]) for s in sampler.samples] == [(1, 10), (2, 20), (3, 30)]
    sampler.close()  # the end: 40 came after the last step's end (the trainer's shutdown): dropped
    assert [(s[0], s[1]) for s in sampler.samples] == [(1, 10), (2, 20), (3, 30)]


def test_a_sample_no_row_covers_takes_the_steps_seen_after_a_pause(monkeypatch) -> None:
    monkeypatch.setattr(trainer_cpu, "read_thread_cpu", lambda pid, tid: ("schedstat", 1, 0))
    clock = [0]
    sampler = TrainerCpuSampler(None, 0, "r", 1, print, interval_s=1e-9, clock=lambda: clock[0])
    sampler.tid = 42
    sampler.steps([_row(1), _row(2)])
    for at in (5, 10_000):  # after the last row: they wait for the rows that would cover them
        clock[0] = at
        sampler.tick()
    assert sampler.samples == []
    clock[0] += int(trainer_cpu.RESOLVE_AFTER_S * 1e9)
    sampler.tick()  # no row for 2 s: a pause, the earlier two take the steps seen; the new one waits
    assert [(s[0], s[1]) for s in sampler.samples] == [(2, 5), (2, 10_000)]


def test_no_sample_before_the_time_record_names_the_thread(tmp_path: Path) -> None:
    _name_thread(tmp_path, 0, None)
    sampler = TrainerCpuSampler(tmp_path, 0, "r", os.getpid(), print, interval_s=0.01)
    sampler.sample()
    assert sampler.samples == [] and sampler.tid is None
    sampler.close()
    assert not (tmp_path / "rank-0.cpu.json").exists()
    _name_thread(tmp_path, 0, threading.get_native_id())  # the first step ran: named
    sampler.sample()
    assert sampler.tid == threading.get_native_id()


def test_samples_stay_bounded_and_keep_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_cpu, "MAX_SAMPLES", 64)
    monkeypatch.setattr(trainer_cpu, "read_thread_cpu", lambda pid, tid: ("schedstat", 1, 0))
    clock = [0]
    sampler = TrainerCpuSampler(None, 0, "r", 1, print, interval_s=0.1, clock=lambda: clock[0])
    sampler.tid = 42
    for step in range(1000):
        clock[0] = step * 10
        sampler.steps([_row(clock[0])])
        sampler.sample()
    assert len(sampler.samples) < 64 and sampler.thinned >= 4
    assert sampler.samples[-1][0] == 1000 and sampler.interval_s == pytest.approx(0.1 * 2 ** sampler.thinned)


def test_a_thread_or_process_that_is_gone_reads_as_nothing() -> None:
    assert read_thread_cpu(os.getpid(), 2**22 + 12345) is None  # above any pid_max: no such thread
    assert read_process_cpu(2**22 + 12345) == -1
    reading = read_thread_cpu(os.getpid(), threading.get_native_id())
    assert reading is not None and reading[1] > 0 and read_process_cpu(os.getpid()) >= 0


def test_a_write_failure_turns_the_sampling_off_and_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trainer_cpu, "read_thread_cpu", lambda pid, tid: ("schedstat", 1, 0))
    said: list[str] = []
    blocked = tmp_path / "file"
    blocked.write_text("")
    sampler = TrainerCpuSampler(blocked, 0, "r", 1, said.append)  # the "folder" is a file
    sampler.tid = 42
    sampler.steps([_row(time.perf_counter_ns() + 10**12)])  # a row that covers the sample below
    sampler.sample()
    sampler.close()  # the write that fails
    sampler.write()
    sampler.tick()
    assert len(said) == 1 and "CPU samples not written" in said[0] and sampler.off


def test_a_thread_the_trainer_does_not_have_is_dropped_and_the_record_read_again(tmp_path: Path) -> None:
    """A restarted attempt's emitter may read the earlier attempt's record before the new one names its
    thread: that id is no thread of this trainer, so it samples nothing and asks the record again."""
    _name_thread(tmp_path, 0, 2**22 + 12345)  # no such thread here
    sampler = TrainerCpuSampler(tmp_path, 0, "r", os.getpid(), print)
    sampler.sample()
    assert sampler.samples == [] and sampler.tid is None
    _name_thread(tmp_path, 0, threading.get_native_id())  # the new attempt's record
    sampler.steps([_row(time.perf_counter_ns() + 10**12)])
    sampler.sample()
    sampler.close()
    assert sampler.tid == threading.get_native_id() and sampler.samples


def test_the_childrens_cpu_counts_live_and_reaped_children_but_the_excluded_one() -> None:
    """A child that burns CPU (a DataLoader worker) counts while it lives and after it is reaped; the
    excluded one (the emitter) never does; a process that is gone reads as nothing."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
        pytest.skip("this kernel does not list a thread's children (CONFIG_PROC_CHILDREN)")
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n" \
           "time.sleep(30)"

    def on_cpu(exclude: int) -> int:
        reading = read_children_cpu(os.getpid(), exclude)
        assert reading is not None and reading[1] >= 0
        return reading[0]

    before = on_cpu(-1)
    worker = subprocess.Popen([sys.executable, "-c", burn])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and on_cpu(idle.pid) - before < 0.4e9:
            time.sleep(0.05)
        live = on_cpu(idle.pid) - before
        assert 0.4e9 <= live < 2.0e9, live  # the worker's 0.4 s and its start-up; not the idle one's
        worker.kill()
        worker.wait()
        assert on_cpu(idle.pid) - before >= live - 0.02e9  # reaped: in cutime
    finally:
        for process in (worker, idle):
            process.kill()
            process.wait()
    assert read_children_cpu(2**22 + 7, exclude=-1) is None


def test_the_childrens_cpu_counts_grandchildren_as_a_forkserver_makes_them() -> None:
    """Under the ``forkserver`` start method (Python 3.14's default on Linux) DataLoader workers are
    children of the server process, not of the trainer: a grandchild that burns CPU counts."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
        pytest.skip("this kernel does not list a thread's children (CONFIG_PROC_CHILDREN)")
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n" \
           "time.sleep(30)"
    server = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(30)")
    before = read_children_cpu(os.getpid(), exclude=-1)
    assert before is not None
    parent = subprocess.Popen([sys.executable, "-c", server])
    try:
        deadline = time.monotonic() + 20
        used = 0
        while time.monotonic() < deadline and used < 0.4e9:
            reading = read_children_cpu(os.getpid(), exclude=-1)
            assert reading is not None
            used = reading[0] - before[0]
            time.sleep(0.05)
        assert used >= 0.4e9, used
    finally:
        for child in _children_of(parent.pid):
            os.kill(child, 9)
        parent.kill()
        parent.wait()


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except OSError:
        return []
