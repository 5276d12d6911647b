"""The live view's model: one verdict with the analyzer, silent and waiting ranks, and 1,024 ranks bounded."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.emit.test_live_summary import _line
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.run_model import LoadedRun, StepTiming, WindowSpec
from traceml_otel.emit.live_summary import LiveWindow, parse_table_line
from traceml_otel.emit.step_table import csv_line
from traceml_otel.launch.live_panel import render_panel
from traceml_otel.launch.live_view import LineSplitter
from traceml_otel.report.live_view import LiveFolder, LiveSnapshot, flag_sentences, live_line, snapshot
from traceml_otel.wire.live_record import LiveHang, LiveRecord
from traceml_otel.wire.step_table import COLUMNS


def _window(tmp_path: Path, rank: int) -> LiveWindow:
    return LiveWindow(tmp_path, "r", rank, local_rank=rank, world_size=2, host="h", trainer_pid=0,
                      dropped=lambda: 0, degraded=lambda: [], hang=lambda: None, warn=lambda m: None)


def _rank_line(step: int, traced: float, wait: float, rank: int) -> str:
    return _line(step, traced, wait).replace(",1,", f",{rank},", 1)


def _published(tmp_path: Path, lines: dict[int, list[str]]) -> tuple[LiveSnapshot, tuple[StepTiming, ...]]:
    """Each rank's table lines through its emitter's live window: the viewer's snapshot of the records,
    and the same lines as the analyzer's step records."""
    for rank, rank_lines in lines.items():
        window = _window(tmp_path, rank)
        window.add(["".join(rank_lines)], len(rank_lines))
        window.publish()
    steps = tuple(t for rank_lines in lines.values() for line in rank_lines if (t := parse_table_line(line)))
    return snapshot(LiveFolder(tmp_path).read()), steps


@pytest.mark.parametrize(("wait", "traced"), [(0.08, 0.05), (0.001, 0.1)])
def test_live_verdict_is_the_analyzers(tmp_path: Path, wait: float, traced: float) -> None:
    lines = {rank: [_rank_line(i, traced * (1 + 0.3 * rank), wait, rank)
                    for i in range(150)] for rank in (0, 1)}
    snap, steps = _published(tmp_path, lines)
    assert {s.rank for s in steps} == {0, 1}
    analysis = analyze_run(LoadedRun("r", steps, "test"), WindowSpec(last=100))
    assert snap.verdict == str(analysis.step.primary.kind)
    assert snap.verdict_why == analysis.step.primary.why


def test_a_compile_step_leaves_the_live_verdict_as_it_leaves_the_analyzers(tmp_path: Path) -> None:
    """In the first 100 steps the live window starts at step 0: its 15 s compile is no part of the live
    verdict either (the ordinary steps wait 0.08 s of 0.13: INPUT_BOUND, not the compile's forward)."""
    lines = {rank: [_rank_line(i, 15.0 if i == 0 else 0.05, 0.08, rank)
                    for i in range(60)] for rank in (0, 1)}
    snap, steps = _published(tmp_path, lines)
    analysis = analyze_run(LoadedRun("r", steps, "test"))
    assert analysis.window.startup_steps == 1
    assert snap.verdict == str(analysis.step.primary.kind) == "INPUT_BOUND"
    assert snap.verdict_why == analysis.step.primary.why


def _stalled_line(step: int, rank: int, culprit: bool) -> str:
    """A 7 s step: the culprit's outside the phases (a slow read), the peer's waiting in backward."""
    line = _rank_line(step, 7.05, 0.001, rank)
    values = dict(zip(COLUMNS, next(csv.reader([line])), strict=True))
    values.update(cpu_forward="0.0125", cpu_backward="0.025" if culprit else "7.0", cpu_optimizer="0.006")
    return csv_line([values[name] or None for name in COLUMNS])


def test_a_resolved_stall_leaves_the_live_verdict_as_it_leaves_the_analyzers(tmp_path: Path) -> None:
    """Rank 1 stops 7 s in step 120 and goes on; rank 0 waits for it. For the next 100 steps the live
    window holds that step: as in the analyzer, it is a stall, never a straggler (it once read
    "STRAGGLER: rank 1 holds the others back" on the panel until the step left the window)."""
    lines = {rank: [_rank_line(i, 0.05, 0.001, rank) if i != 120
                    else _stalled_line(i, rank, culprit=rank == 1) for i in range(150)] for rank in (0, 1)}
    snap, steps = _published(tmp_path, lines)
    analysis = analyze_run(LoadedRun("r", steps, "test"), WindowSpec(last=100))
    assert analysis.stalls.events and 120 in analysis.stalls.stalled_steps()
    assert "STRAGGLER" not in str(analysis.step.primary.kind)
    assert snap.verdict == str(analysis.step.primary.kind) == "RESIDUAL_HEAVY"  # 1/8 of each step


def _backward_line(step: int, rank: int, backward: float) -> str:
    line = _rank_line(step, 0.1, 0.001, rank)
    values = dict(zip(COLUMNS, next(csv.reader([line])), strict=True))
    values.update(cpu_forward="0.02", cpu_backward=str(backward), cpu_optimizer="0.01")
    return csv_line([values[name] or None for name in COLUMNS])


def test_a_straggler_verdict_names_its_rank_on_the_line(tmp_path: Path) -> None:
    """Rank 0 waits 35 ms a step in backward for rank 1: the panel's verdict is the analyzer's, and the
    greppable line says which rank (``verdict=STRAGGLER culprit=1``), not only that one straggles."""
    lines = {rank: [_backward_line(i, rank, 0.06 if rank == 0 else 0.025) for i in range(150)]
             for rank in (0, 1)}
    snap, steps = _published(tmp_path, lines)
    analysis = analyze_run(LoadedRun("r", steps, "test"), WindowSpec(last=100))
    assert str(analysis.step.primary.kind).endswith("STRAGGLER")
    assert snap.verdict == str(analysis.step.primary.kind) and snap.culprit == 1
    fields = dict(part.split("=", 1) for part in live_line(snap).split()[1:])
    assert fields["culprit"] == "1" and fields["verdict"] == snap.verdict
    (tmp_path / "healthy").mkdir()
    even = {rank: [_rank_line(i, 0.05, 0.001, rank) for i in range(150)] for rank in (0, 1)}
    healthy, _ = _published(tmp_path / "healthy", even)
    assert healthy.culprit is None and live_line(healthy).endswith(" culprit=-")


def _record(rank: int, now: float, **changes: object) -> LiveRecord:
    base = dict(run_id="big", rank=rank, seq=5, written_at=now - 0.5, world_size=1024, steps=500 + rank % 7,
                last_step_at=now - 0.2, step_median_s=0.1 + rank * 1e-5, step_p95_s=0.12, window_steps=100,
                window={"steps": 100.0, "step_time": 0.1, "input_wait": 0.01, "traced": 0.09, "forward": 0.03,
                        "backward": 0.04, "optimizer": 0.01, "h2d": 0.0, "compute": 0.08, "residual": 0.01,
                        "communication": 0.0, "between_steps": 0.01, "optimizer_updates": 100.0,
                        "micro_steps": 0.0},
                trainer_state="running")
    base.update(changes)
    return LiveRecord(**base)  # type: ignore[arg-type]


def test_silent_stopped_waiting_and_hung_ranks() -> None:
    now = time.time()
    records = {
        0: _record(0, now, last_step_at=now - 4.5),  # waiting: running, no step
        1: _record(1, now, trainer_state="stopped", last_step_at=now - 4.2),
        2: _record(2, now, written_at=now - 6.0),  # its emitter stopped writing
        3: _record(3, now, hang=LiveHang("hung", 70.0, "backward", "train.py:42", "loss.backward()",
                                         "all_reduce #9 (0)"), last_step_at=now - 70),
        4: _record(4, now),
        5: _record(5, now, ended=True, end_status="trainer exited without shutdown (killed?)"),
        6: _record(6, now, ended=True, end_status="ok"),
    }
    snap = snapshot(records, now)
    states = {flag.rank: (flag.state, round(flag.age_s, 1)) for flag in snap.flags}
    assert states == {0: ("waiting", 4.5), 1: ("not reporting", 4.2), 2: ("not reporting", 6.0),
                      3: ("hung", 70.0), 5: ("exited", 0.5)}
    assert snap.reporting == 5  # 7 ranks, 2 not reporting (the ended ones reported their end)
    line = live_line(snap)
    assert "silent=1:4.2s,2:6.0s" in line and "waiting=0:4.5s,3:70.0s" in line
    assert "hang=in_all_reduce_#9_(0)_at_train.py:42" in line
    assert any(s.startswith("EXITED: rank 5 (trainer exited") for s in flag_sentences(snap))


def test_1024_ranks_stay_bounded() -> None:
    now = time.time()
    records = {r: _record(r, now, **({"written_at": now - 10} if r % 100 == 0 else {})) for r in range(1024)}
    records[777] = _record(777, now, step_median_s=0.5)
    started = time.perf_counter()
    snap = snapshot(records, now)
    elapsed = time.perf_counter() - started
    assert snap.slowest[0] == (777, 0.5) and len(snap.slowest) == 3 and len(snap.fastest) == 3
    assert snap.reporting == 1024 - 11
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=False).print(render_panel(snap))
    screen = out.getvalue().splitlines()
    assert len(screen) <= 22, "\n".join(screen)
    line = live_line(snap)
    assert "silent=0:10.0s,100:10.0s" in line and ",+3 " in line and len(line) < 800
    assert elapsed < 1.0


def test_control_characters_never_reach_the_screen() -> None:
    now = time.time()
    evil = _record(0, now, run_id="evil\x1b[2Jrun", degraded=("local copy: \x1b]0;pwned\x07x",))
    snap = snapshot({0: evil}, now)
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=False).print(render_panel(snap))
    assert "\x1b" not in out.getvalue() and "\x1b" not in live_line(snap)


def test_line_splitter_keeps_order_and_progress_bars() -> None:
    split = LineSplitter()
    assert split.feed("a\r\nb") == "a\n" and split.current == "b"
    assert split.feed("c\n10%\r20%") == "bc\n" and split.current == "20%"
    assert split.feed("\r100%\n") == "100%\n" and split.current == ""


def test_a_skewed_writer_clock_neither_hides_nor_fakes_silence(tmp_path: Path) -> None:
    from traceml_otel.wire.live_record import write_live_record

    now = time.time()
    folder = LiveFolder(tmp_path)
    write_live_record(tmp_path, _record(0, now, seq=1, written_at=now - 30))  # writer's clock 30 s behind
    folder.read()
    write_live_record(tmp_path, _record(0, now, seq=2, written_at=now - 29))
    folder.read()
    assert snapshot(folder.records, now + 1, frozen_since=folder.frozen_since).reporting == 1  # it moves
    later = now + 20  # no new seq for 20 s of the reader's clock, writer's clock 10 s ahead
    write_live_record(tmp_path, _record(0, now, seq=2, written_at=later + 10))
    folder.read()
    snap = snapshot(folder.records, later, frozen_since=folder.frozen_since)
    assert snap.reporting == 0 and snap.flags[0].age_s >= 19
