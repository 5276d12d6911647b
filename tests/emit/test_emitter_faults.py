"""Each emitter output fails alone: the others go on, the reason is said once and counted."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.emit import pipe_session, worker
from traceml_otel.emit.channel import EmitterChannel
from traceml_otel.emit.worker import Emitter
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.step_row import PhaseRow, StepRow


def _rows(first: int, count: int) -> list[StepRow]:
    rows = []
    for step in range(first, first + count):
        start = step * 1_000_000
        phases = [PhaseRow.timed("forward", 0, start + 10, start + 500_000, None)]
        rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + 900_000,
                             input_wait_ns=1000, input_fetches=1, optimizer_steps=1,
                             phases=phases))
    return rows


def _hello(run_dir: Path | None, **extra: object) -> Hello:
    return replace(Hello(run_id="r", rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                         anchor_ns=0, shutdown_timeout_s=2, run_dir=None if run_dir is None else str(run_dir),
                         sampler="always_on"), **extra)


def test_a_full_disk_turns_off_the_local_copy_only(tmp_path: Path, capsys) -> None:
    emitter = Emitter(_hello(tmp_path))
    emitter.handle_steps(_rows(0, 10))
    assert emitter.local is not None
    os.close(emitter.local._fd)
    emitter.local._fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC, from the kernel
    emitter.handle_steps(_rows(10, 10))
    emitter.handle_steps(_rows(20, 10))  # keeps going, says nothing more
    while emitter.has_export_work:
        emitter.export_next()
    emitter.finish("ok", 0, True, steps_traced=30)
    stats = json.loads((tmp_path / c.export_stats_file_name(0)).read_text())
    assert stats["steps_received"] == 30 and stats["steps_local"] == 10
    assert stats["local_copy_complete"] is False and stats["final"]
    assert "No space left" in stats["outputs_disabled"]["local copy"]
    assert stats["metrics_skipped_steps"] == 0  # metrics still recorded every step
    lines = [line for line in capsys.readouterr().err.splitlines() if "local copy turned off" in line]
    assert len(lines) == 1 and lines[0].startswith("traceml: rank 0: local copy turned off")


def test_a_busy_prometheus_port_turns_off_that_endpoint_only(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        emitter = Emitter(_hello(tmp_path, prometheus_port=port))
        emitter.handle_steps(_rows(0, 5))
        emitter.finish("ok", 0, True, steps_traced=5)
    stats = json.loads((tmp_path / c.export_stats_file_name(0)).read_text())
    assert "Prometheus endpoint" in stats["outputs_disabled"]
    assert stats["local_copy_complete"] is True and stats["steps_local"] == 5
    assert "traceml: rank 0: Prometheus endpoint turned off" in capsys.readouterr().err


def test_a_failing_exporter_turns_off_otlp_and_counts_the_rest(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    emitter = Emitter(_hello(tmp_path, traces_endpoint="http://127.0.0.1:9", traces_protocol="http/protobuf"))
    assert emitter.shipper is not None

    def broken(span: object) -> object:
        raise RuntimeError("converter bug")

    emitter.shipper._convert = broken
    emitter.handle_steps(_rows(0, 4))
    emitter.handle_steps(_rows(4, 4))
    while emitter.has_export_work:
        emitter.export_next()
    emitter.finish("ok", 0, True, steps_traced=8)
    stats = emitter.stats
    assert "OTLP span export" in stats.outputs_disabled
    assert stats.otlp_dropped == 16  # 8 steps x 2 spans: every span counted, none exported
    assert stats.local_copy_complete and len(read_run(tmp_path)) == 16


def test_a_symlink_planted_at_the_local_copy_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    (tmp_path / c.traces_file_name(0)).symlink_to(target)
    emitter = Emitter(_hello(tmp_path))
    emitter.handle_steps(_rows(0, 3))
    emitter.finish("ok", 0, True, steps_traced=3)
    assert target.read_text() == "precious\n"
    assert "local copy" in emitter.stats.outputs_disabled
    assert emitter.stats.local_copy_complete is False and emitter.stats.steps_local == 0


def test_steps_in_the_pipe_when_the_emitter_dies_are_counted(tmp_path: Path) -> None:
    script = "import sys, time; sys.stdin.buffer.read(200); time.sleep(0.5)"  # reads a little, then dies
    channel = EmitterChannel(_hello(tmp_path), command=[sys.executable, "-c", script])
    for first in range(0, 640, 64):
        channel.send_steps(_rows(first, 64))
    channel._process.wait(timeout=10)
    channel.close(timeout_s=1.0, traced=640)
    assert channel.local_report is None  # the emitter never said what it wrote
    assert channel.steps_offered == 640


@pytest.mark.parametrize("timeout_s", [0.0, 1.0])
def test_shutdown_hands_over_a_backlog_far_larger_than_the_deadline_allows(tmp_path: Path,
                                                                         timeout_s: float) -> None:
    """The emitter sleeps 3 s before reading: longer than the deadline; nothing may be dropped."""
    hello = _hello(tmp_path)
    slow_start = ("import time, runpy, sys; time.sleep(3); sys.argv = ['w'] + sys.argv[1:]; "
                  "runpy.run_module('traceml_otel.emit.worker', run_name='__main__')")
    channel = EmitterChannel(hello, command=[sys.executable, "-c", slow_start])
    for first in range(0, 20_000, 64):
        channel.send_steps(_rows(first, min(64, 20_000 - first)))
    assert channel._backlog_bytes > 0
    started = time.monotonic()
    channel.close(timeout_s=timeout_s, traced=20_000)
    assert channel.dropped_steps == 0, channel.broken
    assert channel.local_report is None or channel.local_report.steps == 20_000
    stats = json.loads((tmp_path / c.export_stats_file_name(0)).read_text())
    assert stats["steps_local"] == 20_000 and stats["local_copy_complete"] is True
    assert time.monotonic() - started < 120


def test_the_local_copy_thread_runs_below_the_trainer_until_shutdown() -> None:
    assert worker.nice_this_thread(0) is sys.platform.startswith("linux")


def test_the_export_statistics_file_holds_only_its_json(tmp_path: Path) -> None:
    """No padding a `cat` would show: the room for an in-place final write is reserved on disk instead."""
    emitter = Emitter(_hello(tmp_path))
    emitter.handle_steps(_rows(0, 3))
    emitter.finish("ok", 0, True, steps_traced=3)
    path = tmp_path / "rank-0.export.json"
    text = path.read_text()
    assert text == text.strip() or text == text.strip() + "\n"
    assert json.loads(text)["final"] is True


def test_the_emitter_keeps_its_long_lived_heap_out_of_garbage_collections(tmp_path: Path) -> None:
    """The OTel SDK's, gRPC's and our own modules' objects are frozen (``gc.freeze``) once the emitter
    has started, so the collections the steps' records trigger never scan them; young collections
    run at the emitter's own threshold. The steps are all written as before."""
    out = tmp_path / "gc.json"
    script = ("import atexit, gc, json, runpy, sys; "
              f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps("
              "[gc.get_freeze_count(), gc.get_threshold()]))); "
              "sys.argv = ['w'] + sys.argv[1:]; "
              "runpy.run_module('traceml_otel.emit.worker', run_name='__main__')")
    channel = EmitterChannel(_hello(tmp_path), command=[sys.executable, "-c", script])
    for first in range(0, 2048, 64):
        channel.send_steps(_rows(first, 64))
    channel.close(timeout_s=30.0, traced=2048)
    assert channel.local_report is not None and channel.local_report.steps == 2048
    frozen, thresholds = json.loads(out.read_text())
    assert frozen > 20_000  # the modules' objects, not a few
    assert tuple(thresholds) == pipe_session.GC_THRESHOLDS


def test_a_capture_span_written_after_the_last_step_is_in_the_count(tmp_path: Path) -> None:
    """A deep capture's summary is often written after the last step's batch (its export runs at the end):
    its ``traceml.capture`` span in the local copy is counted in ``spans_local`` (the account's total)."""
    from traceml_otel.wire.capture_record import CaptureSummary, write_summary
    from traceml_otel.wire.export_stats import read_export_stats

    emitter = Emitter(_hello(tmp_path))
    emitter.handle_steps(_rows(0, 20))
    write_summary(tmp_path, CaptureSummary(run_id="r", rank=0, index=1, reason="on_demand", request_id="x",
                                           steps=(5, 6), finished_unix=time.time()))
    emitter.poll_hang(force=True)
    emitter.finish("ok", 0, True, steps_traced=20)
    spans = read_run(tmp_path)
    assert sum(span.name == c.SPAN_CAPTURE for span in spans) == 1
    (stats,) = read_export_stats(tmp_path).stats
    assert stats.spans_local == len(spans) and stats.steps_local == 20
