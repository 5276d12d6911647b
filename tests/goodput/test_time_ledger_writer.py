"""The time ledger writes its record off the training thread during training, and the final record
at shutdown is the last one written, whatever the writer thread was doing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from traceml_otel.capture import time_ledger
from traceml_otel.capture.time_ledger import TimeLedger
from traceml_otel.wire.time_record import read_time_record

WAIT_S = 10.0  # only ever reached when the behaviour is wrong


class GatedWrites:
    """Stands in for ``write_time_record`` around the real one: says which thread wrote, and holds
    each write until the test opens the gate."""

    def __init__(self) -> None:
        self.real = time_ledger.write_time_record
        self.gate = threading.Event()
        self.started = threading.Event()
        self.threads: list[str] = []
        self.ended_flags: list[bool] = []

    def __call__(self, run_dir, record) -> None:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.gate.wait(WAIT_S)
        self.real(run_dir, record)
        self.ended_flags.append(record.ended_at is not None)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> GatedWrites:
    gated = GatedWrites()
    monkeypatch.setattr(time_ledger, "write_time_record", gated)
    return gated


def test_a_block_and_a_flops_measurement_are_written_by_the_writer_thread(tmp_path: Path, writes) -> None:
    ledger = TimeLedger(tmp_path, 0, "r", lambda: 3, min_interval_s=0.0)
    ledger.start_writer()
    ledger.enter_outside()
    ledger.exit_outside("evaluation", in_step=False)  # returns while the write is held at the gate
    assert writes.started.wait(WAIT_S)
    assert writes.threads == ["traceml-time-record"]
    ledger.measured_flops(1e9, 2, "cpu")  # also returns at once: the writer is still held
    writes.gate.set()
    ledger.write(ended=True)  # waits for the writer's write, then writes the final record
    record = read_time_record(tmp_path / "rank-0.time.json")
    assert [o.kind for o in record.outside] == ["evaluation"]
    assert record.flops.measured == 1e9 and record.ended_at is not None
    assert writes.ended_flags[-1] is True


def test_the_first_flops_declaration_signals_the_writer_and_later_ones_do_not(tmp_path: Path, writes) -> None:
    writes.gate.set()
    ledger = TimeLedger(tmp_path, 0, "r", lambda: 1)
    for _ in range(5):
        ledger.declare_step_flops(100.0)
    ledger.write(ended=True)
    assert writes.threads.count("traceml-time-record") <= 1  # lazily started on the first use
    assert read_time_record(tmp_path / "rank-0.time.json").flops.declared_steps == 5


def test_nothing_replaces_the_final_record(tmp_path: Path, writes) -> None:
    writes.gate.set()
    ledger = TimeLedger(tmp_path, 0, "r", lambda: 1, min_interval_s=0.0)
    ledger.start_writer()
    ledger.write(ended=True)
    written = len(writes.threads)
    ledger.enter_outside()
    ledger.exit_outside("checkpoint", in_step=False)  # after the end: not written
    ledger.write()
    assert len(writes.threads) == written
    assert read_time_record(tmp_path / "rank-0.time.json").ended_at is not None
    assert ledger._writer is not None
    ledger._writer.join(WAIT_S)
    assert not ledger._writer.is_alive()  # the final write ends the writer thread


def test_a_failing_write_is_counted_and_said_once_without_a_traceback(tmp_path: Path, monkeypatch) -> None:
    said: list[str] = []
    calls: list[int] = []

    def broken(run_dir, record) -> None:
        calls.append(1)
        raise ValueError("not encodable")

    monkeypatch.setattr(time_ledger, "write_time_record", broken)
    hooked: list[object] = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    ledger = TimeLedger(tmp_path, 0, "r", lambda: 1, min_interval_s=0.0, warn=said.append)
    for _ in range(2):
        done = len(calls)
        ledger.enter_outside()
        ledger.exit_outside("evaluation", in_step=False)
        for _ in range(1000):  # the writer thread's attempt, polled
            if len(calls) > done and ledger.write_errors > done:
                break
            threading.Event().wait(0.01)
    assert ledger.write_errors == 2 and len(said) == 1 and "not encodable" in said[0]
    assert hooked == [] and ledger._writer is not None and ledger._writer.is_alive()
