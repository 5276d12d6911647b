"""The emitter's live window: table lines parsed back, the analyzer's measures, the trainer's state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceml_otel.emit.live_summary import LiveWindow, live_records_enabled, parse_table_line, trainer_state
from traceml_otel.emit.step_table import csv_line
from traceml_otel.wire.live_record import live_file_name, read_live_record
from traceml_otel.wire.step_table import COLUMNS


def _line(step: int, traced: float, wait: float = 0.01) -> str:
    values: dict[str, object] = {name: None for name in COLUMNS}
    values.update(run_id="r", rank=1, step=step, trace_id="t", start_unix_nano=int((1e9 + step * 0.2) * 1e9),
                  parallelism="none", world_size=2, traced_cpu=traced, input_wait_cpu=wait,
                  calls_forward=1, calls_backward=1, calls_optimizer=1, cpu_forward=traced / 4,
                  cpu_backward=traced / 2, cpu_optimizer=traced / 8, optimizer_steps=1, samples=32,
                  peak_allocated=1000 + step, between_cpu=wait, source="trace_step",
                  loader_pin_memory=True, spans=4)
    return csv_line([values[name] for name in COLUMNS])


def test_parse_table_line() -> None:
    timing = parse_table_line(_line(5, 0.2))
    assert timing is not None and timing.step == 5 and timing.rank == 1
    assert timing.traced_cpu == 0.2 and timing.samples == 32
    assert parse_table_line("a,b,c\n") is None


def test_window_summary(tmp_path: Path) -> None:
    window = LiveWindow(tmp_path, "r", 1, local_rank=1, world_size=2, host="h", trainer_pid=os.getpid(),
                        dropped=lambda: 3, degraded=lambda: ["metrics: off"], hang=lambda: None,
                        warn=lambda m: None)
    lines = [_line(i, 0.1 if i % 10 else 0.5) for i in range(250)]
    window.add(["".join(lines[:200])], 200)
    window.add(["".join(lines[200:])], 50)
    window.maybe_publish()
    record = read_live_record(tmp_path / live_file_name(1))
    assert record.steps == 250 and record.window_steps == 100 and record.last_step == 249
    assert record.step_median_s is not None and abs(record.step_median_s - 0.11) < 1e-6
    assert record.step_max_s is not None and abs(record.step_max_s - 0.51) < 1e-6
    assert record.window["forward"] is not None and abs(record.window["forward"] - 0.14 / 4) < 1e-6
    assert record.window["samples_per_step"] == 32
    assert record.cuda_peak_bytes == 1249
    assert record.dropped == 3 and record.degraded == ("metrics: off",)
    assert record.trainer_state == "running" and record.seq == 1
    window.maybe_publish()  # within the second: no rewrite
    assert read_live_record(tmp_path / live_file_name(1)).seq == 1
    window.publish(ended=True, end_status="ok")
    again = read_live_record(tmp_path / live_file_name(1))
    assert again.seq == 2 and again.ended and again.written_at >= record.written_at


def test_trainer_state_stopped_and_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert trainer_state(child.pid) == "running"
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while trainer_state(child.pid) != "stopped" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer_state(child.pid) == "stopped"
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()
    assert trainer_state(child.pid) == "gone"


@pytest.mark.parametrize(("value", "enabled"), [("", True), ("lines", True), ("off", False), ("OFF", False),
                                                ("bogus", True)])
def test_live_records_follow_traceml_live(monkeypatch: pytest.MonkeyPatch, value: str, enabled: bool) -> None:
    monkeypatch.setenv("TRACEML_LIVE", value)
    assert live_records_enabled() is enabled


def test_running_goodput_counts_every_block_and_leaves_a_compile_step_out(tmp_path: Path) -> None:
    """The panel's goodput is the blocks so far over the wall time since the process started (the
    account's step.block), less a compile step by the analyzer's rule; not the window's mean times the
    steps (which read 100 % once the last 100 steps ran slower than the run's earlier ones)."""
    from traceml_otel.wire.step_schema import ROW_FIELDS, SLOT
    from traceml_otel.wire.time_record import TimeRecord, write_time_record

    def rows(blocks_s: list[float]) -> list[list[object]]:
        out = []
        for block in blocks_s:
            row: list[object] = [None] * ROW_FIELDS
            row[SLOT["start_ns"]], row[SLOT["end_ns"]] = 0, int(block * 1e9)
            out.append(row)
        return out

    started = time.time() - 100.0  # the process started 100 s ago
    write_time_record(tmp_path, TimeRecord(1, "r", process_start=started, written_at=started))
    window = LiveWindow(tmp_path, "r", 1, local_rank=1, world_size=2, host="h", trainer_pid=os.getpid(),
                        dropped=lambda: 0, degraded=lambda: [], hang=lambda: None, warn=lambda m: None)
    window.count_blocks(rows([8.0]))  # step 0 compiles 8 s
    assert window.summary().goodput is None  # one step: not told yet
    window.count_blocks([*rows([0.1] * 199), ["not", "a", "row"]])  # a malformed row is skipped
    window.count_blocks(rows([0.5] * 100))  # the last 100 steps ran 5x slower
    goodput = window.summary().goodput
    assert goodput is not None and abs(goodput - (199 * 0.1 + 100 * 0.5) / 100.0) < 0.01  # 70 %, not 100
    window.count_blocks(rows([1.0] * 40))
    assert window.summary().goodput == 1.0  # capped (time placed later, e.g. a clock step, never above)
