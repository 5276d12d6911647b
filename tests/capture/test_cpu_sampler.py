"""The CPU sampler: samples the training thread's counters off that thread, bounded, written atomically."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from traceml_otel.capture import cpu_sampler
from traceml_otel.capture.cpu_sampler import CpuSampler, read_thread_cpu
from traceml_otel.wire.cpu_record import read_cpu_record


class Recorder:
    """The two plain attributes the sampler reads."""

    def __init__(self, owner: int | None) -> None:
        self.owner = owner
        self.step = 0


def test_samples_follow_the_training_thread_and_its_steps(tmp_path: Path) -> None:
    recorder = Recorder(threading.get_ident())
    sampler = CpuSampler(recorder, tmp_path, 3, "run-x", print, interval_s=0.01)
    sampler.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(sampler.samples) < 5:  # busy: this thread is the trainer
        recorder.step += 1
        sum(range(20_000))
    sampler.stop()
    record = read_cpu_record(tmp_path / "rank-3.cpu.json")
    assert record.run_id == "run-x" and record.rank == 3 and record.source in ("schedstat", "stat")
    assert len(record.samples) >= 5
    steps, clocks, on_cpu = ([s[i] for s in record.samples] for i in range(3))
    assert steps == sorted(steps) and steps[-1] == recorder.step
    assert clocks == sorted(clocks) and on_cpu == sorted(on_cpu) and on_cpu[-1] > on_cpu[0]
    assert threading.get_ident() != sampler._thread.ident  # type: ignore[union-attr]


def test_no_sample_before_the_first_step_and_none_written(tmp_path: Path) -> None:
    sampler = CpuSampler(Recorder(None), tmp_path, 0, "r", print, interval_s=0.01)
    sampler.sample()
    sampler.stop()
    assert sampler.samples == [] and not (tmp_path / "rank-0.cpu.json").exists()


def test_samples_stay_bounded_and_keep_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_sampler, "MAX_SAMPLES", 64)
    recorder = Recorder(threading.get_ident())
    sampler = CpuSampler(recorder, None, 0, "r", print, interval_s=0.1)
    for step in range(1000):
        recorder.step = step
        sampler.sample()
    assert len(sampler.samples) < 64 and sampler.thinned >= 4
    assert sampler.samples[-1][0] == 999 and sampler.interval_s == pytest.approx(0.1 * 2 ** sampler.thinned)


def test_a_thread_that_is_gone_reads_as_nothing() -> None:
    assert read_thread_cpu(2**22 + 12345) is None  # above any pid_max: no such thread here
    reading = read_thread_cpu(threading.get_native_id())
    assert reading is not None and reading[1] > 0


def test_a_write_failure_turns_the_sampler_off_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    blocked = tmp_path / "file"
    blocked.write_text("")
    recorder = Recorder(threading.get_ident())
    sampler = CpuSampler(recorder, blocked, 0, "r", said.append)  # the "folder" is a file
    sampler.sample()
    sampler.write()
    sampler.write()
    assert len(said) == 1 and "CPU samples not written" in said[0]
