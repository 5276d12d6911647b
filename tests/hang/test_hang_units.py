"""The pieces of hang detection in one process: records, the verdict, the watchdog, the monitor."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from tests.capture.list_sink import ListSink
from traceml_otel.analyze.hang import combine, read_hang_records
from traceml_otel.capture.progress import CollectiveProgress
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.capture.watchdog import HangWatchdog
from traceml_otel.launch.hang_monitor import EXIT_HANG, HangMonitor
from traceml_otel.wire.hang_record import (
    MAX_EARLIER_EPISODES,
    MAX_FRAMES,
    STATE_RESOLVED,
    HangRecord,
    OpenCollective,
    StackFrame,
    StallEpisode,
    ThreadStack,
    decode_hang_record,
    encode_hang_record,
    parse_faulthandler,
    write_hang_record,
)


def record(rank: int, *, collective: OpenCollective | None = None, entered: int = 0, line: int = 10,
           phase: str = "step", world: int = 2) -> HangRecord:
    return HangRecord(
        rank=rank, world_size=world, run_id="r", state="hung", stalled_s=62.0, timeout_s=60.0, step=40,
        in_step=True, phase="collective" if collective else phase, collective=collective,
        entered={"default": entered}, location=StackFrame("/home/u/train.py", line, "main", "time.sleep(9)"),
    )


def waits(seq: int, kind: str = "all_reduce", source: str = "ddp") -> OpenCollective:
    return OpenCollective(kind, "default", seq, source, 62.0)


def test_the_rank_that_never_entered_the_collective_is_the_culprit() -> None:
    verdict = combine([record(0, collective=waits(81), entered=81), record(1, entered=80, line=23)])
    assert verdict is not None and verdict.culprits == (1,) and verdict.waiting == (0,)
    assert verdict.sentence == ("rank 1 is stuck in user code at train.py:23 (time.sleep(9)) in step 40 "
                                "before its forward; "
                                "rank 0 waits in all_reduce #81 (DDP gradient sync) for 62 s")


def test_a_minority_in_another_collective_is_the_culprit_of_a_mismatch() -> None:
    records = [record(r, collective=waits(7), entered=7) for r in (0, 1, 3)]
    records.append(record(2, collective=waits(7, "broadcast", "api"), entered=7, line=88))
    verdict = combine(records)
    assert verdict.mismatch and verdict.culprits == (2,) and verdict.waiting == (0, 1, 3)
    assert "rank 2 entered broadcast #7 at train.py:88" in verdict.sentence


def test_ranks_without_a_record_are_named_when_the_others_wait() -> None:
    verdict = combine([record(0, collective=waits(5), entered=5, world=4)])
    assert verdict.culprits == () and verdict.missing == (1, 2, 3)
    assert "ranks 1, 2, 3 wrote no hang record" in verdict.sentence


def test_resolved_records_give_no_verdict() -> None:
    assert combine([replace(record(0), state=STATE_RESOLVED)]) is None


def test_a_record_survives_the_round_trip_and_stays_bounded(tmp_path: Path) -> None:
    frames = tuple(StackFrame("/" + "d" * 999, i, "f" * 999, "c" * 999) for i in range(100))
    big = HangRecord(rank=3, world_size=4, run_id="r", state="hung", stalled_s=1.0, timeout_s=1.0, step=1,
                     in_step=False, phase="input",
                     threads=tuple(ThreadStack(f"t{i}", i == 0, frames) for i in range(100)),
                     earlier=tuple(StallEpisode(1e12 + i, 1e9, 10**15, True, "p" * 99, "w" * 999)
                                   for i in range(200)))
    path = write_hang_record(tmp_path, big)
    assert path.name == "rank-3.hang.json" and path.stat().st_size < 1 << 20  # the read limit
    back = decode_hang_record(json.loads(path.read_text()))
    assert len(back.threads) == 32 and len(back.threads[0].frames) == MAX_FRAMES
    assert back.threads[0].frames[-1].line == 99  # the innermost frames are the ones kept
    assert decode_hang_record(json.loads(encode_hang_record(record(1)))) == record(1)


def episode(at: float, stalled: float = 70.0) -> StallEpisode:
    return StallEpisode(progress_at=at, stalled_s=stalled, step=int(at) % 100, in_step=True, phase="forward",
                        where=f"train.py:{int(at) % 97}")


def test_earlier_stalls_round_trip_and_older_records_still_read() -> None:
    current = replace(record(0), earlier=(episode(1000.0), episode(2000.0, 61.5)))
    back = decode_hang_record(json.loads(encode_hang_record(current)))
    assert back == current and back.version == 2 and back.earlier[1].resolved_at == 2061.5
    old = json.loads(encode_hang_record(record(0)))
    for key in ("earlier", "earlier_left_out", "earlier_left_out_s"):
        del old[key]
    old["version"] = 1  # a version-1 file: no episodes, the record reads as before
    assert decode_hang_record(old) == replace(record(0), version=1)


def test_more_stalls_than_the_bound_keep_their_count_and_seconds() -> None:
    many = replace(record(0), earlier=tuple(episode(1000.0 * i, 1.0 + i) for i in range(70)),
                   earlier_left_out=3, earlier_left_out_s=9.0)
    saved = json.loads(encode_hang_record(many))
    back = decode_hang_record(saved)
    assert len(back.earlier) == MAX_EARLIER_EPISODES and back.earlier[0] == many.earlier[6]  # the newest
    assert back.earlier_left_out == 3 + 6 and back.earlier_left_out_s == 9.0 + sum(1.0 + i for i in range(6))
    saved["earlier"] = [episode_json for episode_json in saved["earlier"] for _ in range(2)]  # a longer list
    back = decode_hang_record(saved)  # ... read (a hand-made file): bounded the same way, nothing lost
    assert len(back.earlier) == MAX_EARLIER_EPISODES and back.earlier_left_out == 9 + 64
    total = sum(e.stalled_s for e in back.earlier) + back.earlier_left_out_s
    assert total == sum(e.stalled_s for e in many.earlier) * 2 - sum(1.0 + i for i in range(6)) + 9.0


def test_faulthandler_dumps_are_parsed_last_dump_first(tmp_path: Path) -> None:
    text = ('Timeout (0:00:04)!\nThread 0x1 (most recent call first):\n  File "/a.py", line 4 in f\n\n'
            'Timeout (0:00:04)!\nThread 0x2 (most recent call first):\n  File "/b.py", line 9 in spin\n'
            '  File "/b.py", line 20 in <module>\n')
    (thread,) = parse_faulthandler(text)
    assert thread.main and [f.line for f in thread.frames] == [20, 9]
    (tmp_path / "rank-1.hang-traceback.txt").write_text(text)
    (loaded,) = read_hang_records(tmp_path)[0]
    assert loaded.rank == 1 and loaded.location.line == 9 and loaded.source == "faulthandler"


def _watchdog(recorder: StepRecorder, run_dir: Path, floor_s: float = 0.4) -> HangWatchdog:
    return HangWatchdog(recorder, CollectiveProgress(), rank=0, world_size=1, run_id="r", host="h",
                        run_dir=run_dir, floor_s=floor_s, factor=3, announce=False, warn=lambda m: None)


def test_the_watchdog_writes_a_record_for_a_stall_and_resolves_it(tmp_path: Path) -> None:
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path)
    watchdog.start()
    try:
        for _ in range(3):
            recorder.begin_step()
            recorder.end_step()
            time.sleep(0.05)
        recorder.begin_step()
        deadline = time.monotonic() + 10
        while watchdog.hang is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the "training thread" sits in its step: a stall
        saved = json.loads((tmp_path / "rank-0.hang.json").read_text())
        assert saved["state"] == "hung" and saved["step"] == 3 and saved["in_step"]
        assert saved["location"]["file"] == __file__  # this test's own line, not the library's
        recorder.end_step()

        def state() -> str:
            return json.loads((tmp_path / "rank-0.hang.json").read_text())["state"]

        deadline = time.monotonic() + 10  # the watchdog drops its hang just before it writes the file
        while state() != "resolved" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog.hang is None and state() == "resolved"
    finally:
        watchdog.stop()
    assert not (tmp_path / "rank-0.hang-traceback.txt").exists()  # empty fallback dump removed


def test_the_watchdog_keeps_every_earlier_stall_in_the_next_record(tmp_path: Path, monkeypatch) -> None:
    """Driven without its thread and with a fake clock: hang, resolve, hang again (three times)."""
    import traceml_otel.capture.watchdog as watchdog_module

    clock = [1000.0]
    monkeypatch.setattr(watchdog_module, "time", SimpleNamespace(time=lambda: clock[0],
                                                                 monotonic=time.monotonic))
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path)

    def saved() -> HangRecord:
        return decode_hang_record(json.loads((tmp_path / "rank-0.hang.json").read_text()))

    for number, stalled in enumerate((70.0, 65.0, 80.0)):
        recorder.begin_step()
        watchdog._report(stalled, 60.0)  # the loop's decision, without its thread
        assert saved().state == "hung" and len(saved().earlier) == number
        clock[0] += 20.0
        watchdog._resolve()
        recorder.end_step()
        clock[0] += 500.0
    last = saved()
    assert last.state == "resolved" and last.stalled_s == 100.0 and last.written_at - 100.0 == 2040.0 - 80
    assert [(e.progress_at, e.stalled_s, e.step, e.in_step) for e in last.earlier] == [
        (1000.0 - 70.0, 90.0, 0, True), (1520.0 - 65.0, 85.0, 1, True)]
    watchdog.episodes = tuple(episode(float(i)) for i in range(MAX_EARLIER_EPISODES))
    watchdog._report(70.0, 60.0)
    watchdog._resolve()
    assert len(watchdog.episodes) == MAX_EARLIER_EPISODES and watchdog.episodes_left_out == 1
    assert watchdog.episodes_left_out_s == 70.0 and watchdog.episodes[-1].stalled_s == 70.0


def test_a_stall_ends_when_its_step_ended_not_at_the_tick_that_saw_it(tmp_path: Path, monkeypatch) -> None:
    """The episode ends at the first progress (the stalled step's end), so its seconds never take the
    next step's or gap's: a 1 s tick used to add up to a second to every stall (the live time counters
    billed it out of between-steps time)."""
    import traceml_otel.capture.watchdog as watchdog_module

    clock = [5000.0]
    monkeypatch.setattr(watchdog_module, "time", SimpleNamespace(time=lambda: clock[0],
                                                                 monotonic=time.monotonic))
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path)
    recorder.begin_step()
    since_ns = time.perf_counter_ns()
    watchdog._report(10.0, 2.0)
    recorder.end_step()  # progress: the stalled step ends ...
    ended_ns = recorder.last_step_end_ns
    recorder.begin_step()  # ... and the next one opens, both before the watchdog's tick
    time.sleep(0.3)
    now_ns = time.perf_counter_ns()
    assert watchdog._first_progress_ns(since_ns, now_ns) == ended_ns
    assert watchdog._first_progress_ns(now_ns, now_ns) == now_ns  # nothing since: now
    watchdog._resolve(ended_ns)
    saved = decode_hang_record(json.loads((tmp_path / "rank-0.hang.json").read_text()))
    # resolved at the step's end, 0.3 s before the (frozen) clock, not at the clock
    assert saved.state == "resolved" and 0.25 <= clock[0] - saved.resolved_at <= 1.0
    assert abs(saved.stalled_s - (saved.written_at - (5000.0 - 10.0))) < 0.01  # from the same last progress


def test_a_hang_still_open_at_a_clean_exit_is_resolved_but_not_after_a_signal(tmp_path: Path) -> None:
    for clean, state in ((True, "resolved"), (False, "hung")):
        recorder = StepRecorder(ListSink())
        watchdog = _watchdog(recorder, tmp_path, floor_s=0.2)
        watchdog.start()
        recorder.begin_step()
        recorder.end_step()
        deadline = time.monotonic() + 10
        while watchdog.hang is None and time.monotonic() < deadline:
            time.sleep(0.05)  # unmarked work after the last step (a final save)
        watchdog.stop(clean=clean)
        assert json.loads((tmp_path / "rank-0.hang.json").read_text())["state"] == state


def test_outside_step_work_and_slower_steps_are_no_hang(tmp_path: Path) -> None:
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path, floor_s=0.6)  # 3x margins: these VMs are loaded
    watchdog.start()
    try:
        recorder.begin_step()
        recorder.end_step()
        recorder.enter_outside("evaluation")
        time.sleep(2.0)  # over three times the floor, inside outside_step
        recorder.exit_outside()
        for duration in (0.2, 0.4, 0.8, 1.6):  # each step twice as slow, under 3x the longest before it
            recorder.begin_step()
            time.sleep(duration)
            recorder.end_step()
        assert watchdog.timeout_s() >= 3 * 0.8 * 0.9
    finally:
        watchdog.stop()
    assert watchdog.records_written == 0 and not (tmp_path / "rank-0.hang.json").exists()


def _spin(seconds: float, watch: Path | None = None) -> bool:
    """Work between steps on this thread (an unmarked evaluation); whether ``watch`` existed meanwhile."""
    end, seen = time.perf_counter() + seconds, False
    while time.perf_counter() < end:
        sum(range(100))
        seen = seen or (watch is not None and watch.exists())
    return seen


def test_work_between_steps_is_no_hang_but_sleep_is_and_so_is_work_that_never_ends(tmp_path: Path) -> None:
    """An unmarked evaluation (the training thread on a CPU between steps) past the timeout is no hang,
    and the rank keeps its outside marker meanwhile (its peers waiting in their next collective report
    none either); a sleep as long is a hang; work past BUSY_LIMIT x the timeout is one, with a note."""
    from traceml_otel.capture.watchdog import BUSY_LIMIT
    from traceml_otel.contract import outside_marker_file_name

    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path, floor_s=0.3)
    marker = tmp_path / outside_marker_file_name(0)
    watchdog.start()
    try:
        for _ in range(3):
            recorder.begin_step()
            recorder.end_step()
        marked = _spin(1.2, marker)  # 4x the timeout, on a CPU
        assert watchdog.records_written == 0 and marked, (watchdog.records_written, marked)
        recorder.begin_step()
        recorder.end_step()
        time.sleep(1.2)  # 4x the timeout, asleep: a stall
        assert watchdog.records_written >= 1 and not marker.exists()
    finally:
        watchdog.stop()
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path, floor_s=0.2)
    watchdog.start()
    try:
        for _ in range(3):
            recorder.begin_step()
            recorder.end_step()
        _spin(BUSY_LIMIT * 0.2 + 1.0)  # work that does not come back to training
        assert watchdog.hang is not None and watchdog.hang.note.startswith("busy between steps for")
    finally:
        watchdog.stop()


def test_the_monitor_reports_once_and_terminates_when_asked(tmp_path: Path, capsys) -> None:
    ended = []
    monitor = HangMonitor(tmp_path, world_size=2, action="terminate", terminate=lambda: ended.append(1))
    write_hang_record(tmp_path, record(0, collective=waits(81), entered=81))
    write_hang_record(tmp_path, record(1, entered=80, line=23))
    monitor.poll()
    monitor.poll()
    err = capsys.readouterr().err
    assert err.count("traceml: HANG: rank 1 is stuck in user code at train.py:23") == 1
    assert ended == [1] and f"exit code {EXIT_HANG}" in err
    from dataclasses import replace

    for rank in (0, 1):
        write_hang_record(tmp_path, replace(record(rank), state=STATE_RESOLVED, stalled_s=1.5))
    monitor.poll()
    assert "traceml: hang resolved" in capsys.readouterr().err


def test_the_flight_recorder_is_dumped_only_when_enabled_and_failures_are_said(tmp_path: Path) -> None:
    from traceml_otel.capture.flight_recorder import dump_flight_recorder

    on = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    assert dump_flight_recorder(tmp_path, 0, lambda: b'{"entries": []}', env={}) == ""
    assert not (tmp_path / "rank-0.flight-recorder.json").exists()
    said = dump_flight_recorder(tmp_path, 0, lambda: b'{"entries": []}', env=on)
    assert said == "flight recorder in rank-0.flight-recorder.json"
    assert json.loads((tmp_path / "rank-0.flight-recorder.json").read_text()) == {"entries": []}

    def broken() -> bytes:
        raise RuntimeError("no NCCL")

    assert dump_flight_recorder(tmp_path, 1, broken, env=on).startswith("flight recorder dump failed")
    other = {"TORCH_FR_BUFFER_SIZE": "8"}
    assert "nothing to dump" in dump_flight_recorder(tmp_path, 1, lambda: None, env=other)


def test_the_emitter_turns_a_new_hang_record_into_one_span_and_the_stalled_gauge(tmp_path: Path) -> None:
    from dataclasses import replace

    from traceml_otel import contract as c
    from traceml_otel.emit.hang_events import HangRecordWatch

    watch = HangRecordWatch(tmp_path, 1, "run")
    assert watch.poll(force=True) is None and watch.state.stalled() == (0.0, "none")
    hung = replace(record(1, line=23), written_at=time.time(), detected_at=time.time())
    write_hang_record(tmp_path, hung)
    span = watch.poll(force=True)
    assert span is not None and span.name == c.SPAN_HANG and span.trace_id == c.step_trace_id("run", 40)
    assert span.attributes[c.ATTR_HANG_LOCATION] == "/home/u/train.py:23"
    assert span.attributes[c.ATTR_PHASE_NAME] == "step"
    seconds, phase = watch.state.stalled()
    assert seconds >= 62.0 and phase == "step"
    write_hang_record(tmp_path, replace(hung, stalled_s=70.0, written_at=time.time() + 1))  # a refresh
    assert watch.poll(force=True) is None  # one span per hang, not per rewrite
    write_hang_record(tmp_path, replace(hung, state=STATE_RESOLVED, written_at=time.time() + 2))
    assert watch.poll(force=True) is None and watch.state.stalled() == (0.0, "none")


def test_each_ranks_hang_span_carries_the_verdict_over_every_ranks_record(tmp_path: Path) -> None:
    from dataclasses import replace

    from traceml_otel import contract as c
    from traceml_otel.emit.hang_events import HangRecordWatch

    now = time.time()
    waiting = replace(record(0, collective=waits(81), entered=81), written_at=now, detected_at=now)
    stuck = replace(record(1, entered=80, line=23), written_at=now, detected_at=now)
    watch = HangRecordWatch(tmp_path, 0, "run", poll_s=0.0, gather_s=30.0)
    write_hang_record(tmp_path, waiting)
    assert watch.poll() is None  # rank 1's record is not there yet: the span waits for it
    write_hang_record(tmp_path, stuck)
    span = watch.poll()
    assert span is not None and span.attributes[c.ATTR_RANK] == 0
    assert span.attributes[c.ATTR_HANG_VERDICT] == combine([waiting, stuck]).sentence
    assert span.attributes[c.ATTR_HANG_VERDICT].startswith("rank 1 is stuck in user code at train.py:23")
    assert span.attributes[c.ATTR_HANG_CULPRIT_RANKS] == [1] and span.attributes[c.ATTR_HANG_CULPRIT] is False
    assert span.attributes[c.ATTR_HANG_CULPRIT_LOCATION] == "train.py:23"
    assert span.attributes[c.ATTR_HANG_WAITING_RANKS] == [0]
    assert watch.poll() is None  # one span per hang
    alone = HangRecordWatch(tmp_path / "alone", 1, "run", poll_s=0.0, gather_s=0.0)
    (tmp_path / "alone").mkdir()
    write_hang_record(tmp_path / "alone", stuck)  # rank 0 never wrote one: sent after the gather time
    span = alone.poll()
    assert span.attributes[c.ATTR_HANG_CULPRIT] is True and span.attributes[c.ATTR_HANG_CULPRIT_RANKS] == [1]
    assert "rank 1 is stuck in user code at train.py:23" in span.attributes[c.ATTR_HANG_VERDICT]


def test_a_fifo_planted_as_a_peers_record_or_dump_cannot_block_the_verdict(tmp_path: Path) -> None:
    import os
    from dataclasses import replace

    from traceml_otel import contract as c
    from traceml_otel.emit.hang_events import HangRecordWatch

    os.mkfifo(tmp_path / "rank-1.hang-traceback.txt")  # nobody writes: a blocking open would hang
    os.mkfifo(tmp_path / "rank-2.hang.json")
    now = time.time()
    write_hang_record(tmp_path, replace(record(0, line=23, world=3), written_at=now, detected_at=now))
    span = HangRecordWatch(tmp_path, 0, "run").poll(force=True)
    assert span is not None and span.attributes[c.ATTR_HANG_CULPRIT_RANKS] == [0]
    assert "rank 0 is stuck in user code at train.py:23" in span.attributes[c.ATTR_HANG_VERDICT]


def test_a_rank_waiting_for_a_peer_in_a_long_outside_step_block_reports_no_hang(tmp_path: Path) -> None:
    peer = StepRecorder(ListSink())  # rank 1 of the same run folder, saving a checkpoint
    peer_watchdog = HangWatchdog(peer, None, rank=1, world_size=2, run_id="r", host="h", run_dir=tmp_path,
                                 floor_s=0.4, factor=3, announce=False, warn=lambda m: None)
    recorder = StepRecorder(ListSink())
    watchdog = _watchdog(recorder, tmp_path, floor_s=0.4)
    for started in (peer_watchdog, watchdog):
        started.start()
    try:
        for each in (peer, recorder):
            each.begin_step()
            each.end_step()
        peer.enter_outside("checkpoint")
        recorder.begin_step()  # rank 0 waits for rank 1 inside its next step
        time.sleep(2.0)
        assert (tmp_path / "rank-1.outside.json").exists() and watchdog.hang is None
        peer.exit_outside()  # the checkpoint is done, yet rank 0 still makes no progress: a hang
        deadline = time.monotonic() + 10
        while watchdog.hang is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog.hang is not None and not (tmp_path / "rank-1.outside.json").exists()
    finally:
        watchdog.stop()
        peer_watchdog.stop()


def test_a_culprit_inside_an_installed_package_is_not_called_user_code() -> None:
    from dataclasses import replace

    frame = StackFrame("/venv/lib/python3.11/site-packages/transformers/trainer.py", 7, "train", "x()")
    verdict = combine([replace(record(0, world=1), location=frame)])
    assert verdict.sentence.startswith("rank 0 is stuck in transformers code at trainer.py:7 (x())")


def test_hang_settings_parse_and_refuse_bad_values() -> None:
    import pytest

    from traceml_otel.errors import SettingsError
    from traceml_otel.settings import load_settings

    assert (load_settings({}).hang_timeout_s, load_settings({}).hang_factor) == (60.0, 5.0)
    assert load_settings({"TRACEML_HANG_TIMEOUT_S": "0"}).hang_timeout_s == 0.0  # watchdog off
    assert load_settings({"TRACEML_HANG_FACTOR": "8"}).hang_factor == 8.0
    for name, value in (("TRACEML_HANG_TIMEOUT_S", "-1"), ("TRACEML_HANG_TIMEOUT_S", "soon"),
                        ("TRACEML_HANG_FACTOR", "0")):
        with pytest.raises(SettingsError):
            load_settings({name: value})


def test_a_rank_stuck_before_its_first_step_is_a_hang_with_its_own_timeout(tmp_path: Path) -> None:
    """From init() to the first step the startup timeout applies (not the floor); the phase says so,
    and the first step resolves it. Without a startup timeout nothing is watched there."""
    recorder = StepRecorder(ListSink())
    unwatched = HangWatchdog(recorder, CollectiveProgress(), rank=1, world_size=2, run_id="r", host="h",
                             run_dir=tmp_path / "off", floor_s=0.2, factor=3, announce=False,
                             warn=lambda m: None)
    watchdog = HangWatchdog(recorder, CollectiveProgress(), rank=0, world_size=2, run_id="r", host="h",
                            run_dir=tmp_path, floor_s=0.2, factor=3, announce=False, warn=lambda m: None,
                            startup_timeout_s=1.0)
    unwatched.start()
    watchdog.start()
    try:
        time.sleep(0.6)  # past the floor, not the startup timeout
        assert watchdog.hang is None
        deadline = time.monotonic() + 10
        while watchdog.hang is None and time.monotonic() < deadline:
            time.sleep(0.05)  # still no step: stuck before the first one
        saved = json.loads((tmp_path / "rank-0.hang.json").read_text())
        assert saved["state"] == "hung" and saved["phase"] == "before first step" and saved["step"] == 0
        assert saved["stalled_s"] >= 1.0
        assert unwatched.hang is None and not (tmp_path / "off" / "rank-1.hang.json").exists()
        recorder.begin_step()
        deadline = time.monotonic() + 10
        while watchdog.hang is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watchdog.hang is None
    finally:
        watchdog.stop()
        unwatched.stop()


def test_a_busy_thread_on_a_crowded_machine_reads_busy_and_a_sleeping_one_does_not() -> None:
    """The watchdog's reading of the training thread counts the wait for a CPU: beside three busy-loop
    processes per CPU (the suite's own load once), a spinning thread got a CPU about a quarter of the time
    (its on-CPU clock read idle then: an unmarked evaluation reported as a hang), yet it wanted one all
    along. Two per CPU here (a shorter crowd for the tests beside it): its on-CPU time is under half."""
    import os
    import subprocess
    import sys
    import threading

    from traceml_otel.capture.thread_cpu import ThreadCpuClock

    clock, ident = ThreadCpuClock(), threading.get_ident()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 * min(len(os.sched_getaffinity(0)), 8))]
    try:
        time.sleep(0.2)
        before, start = clock.read(ident), time.perf_counter()
        _spin(0.5)
        busy = (clock.read(ident) or 0.0) - (before or 0.0)
        wall = time.perf_counter() - start
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy >= 0.8 * wall, (busy, wall)
    before = clock.read(ident)
    time.sleep(0.5)
    assert (clock.read(ident) or 0.0) - (before or 0.0) < 0.1
