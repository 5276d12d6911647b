"""A capture that is never written still leaves its summary, saying why: dropped because too many
waited for export, or left when the shutdown's wait ran out. The report reads it; nothing is lost
silently."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from traceml_otel.capture.capture_export import MAX_DEFERRED, CaptureExporter
from traceml_otel.settings import CaptureSettings
from traceml_otel.wire.capture_record import CaptureRequest, read_summaries


def _stopped(index: int) -> Any:
    """A stopped automatic capture whose export waits for the budget (what the exporter reads of it)."""
    return SimpleNamespace(index=index, deferred=True, steps=[100 + index], step_ms=[4.0],
                           request=CaptureRequest(id=f"r{index}", reason="spike", detail="a spike"),
                           started_unix=1.0, stopped_unix=2.0)


def test_captures_dropped_or_left_at_shutdown_leave_summaries_that_say_why(tmp_path: Path) -> None:
    warnings: list[str] = []
    exporter = CaptureExporter(tmp_path, "run", 0, CaptureSettings(), warnings.append)
    exporter._export = lambda running: time.sleep(1.0)  # type: ignore[method-assign]  # a slow export
    for index in range(1, MAX_DEFERRED + 2):
        exporter.submit(_stopped(index))
    assert len(exporter.deferred) == MAX_DEFERRED and exporter.dropped == 1
    exporter.close(0.2)  # one export runs, one waits in the queue; the rest are left

    summaries, problems = read_summaries(tmp_path)
    assert not problems
    why = {s.index: s.problem for s in summaries}
    assert why[MAX_DEFERRED + 1] == f"dropped: {MAX_DEFERRED} captures already waited for export"
    left = [i for i, problem in why.items() if problem == "not written: the shutdown's wait (0.2 s) ran out"]
    assert len(left) >= MAX_DEFERRED - 2, why
    assert exporter.lost_at_exit >= len(left)
    one = next(s for s in summaries if s.index == left[0])
    assert one.steps == (100 + one.index,) and one.reason == "spike" and one.request_id == f"r{one.index}"
    assert any("not written" in w for w in warnings) and any("dropped" in w for w in warnings)


def test_a_capture_taken_for_a_step_the_training_never_reached_says_so(tmp_path: Path) -> None:
    from traceml_otel.capture.capture_start import close_profiler_capture
    from traceml_otel.capture.profiler_capture import ProfilerCapture

    settings = CaptureSettings()
    session = SimpleNamespace(recorder=SimpleNamespace(step=400), block_model=None)
    exporter = CaptureExporter(tmp_path, "run", 0, settings, print)
    capture = ProfilerCapture(session, settings, exporter, print)  # type: ignore[arg-type]
    capture.arm(CaptureRequest(id="late", reason="spike", detail="every 40 steps", at_step=438, every=40))
    close_profiler_capture(capture, wait_s=1.0)
    (summary,), _ = read_summaries(tmp_path)
    assert (summary.index, summary.request_id, summary.steps) == (1, "late", ())
    assert summary.problem == "not started: armed for step 438, and the training ended at step 399 before it"
