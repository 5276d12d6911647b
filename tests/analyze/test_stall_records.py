"""Stall events from hang records (analyze/stalls.py) on synthetic steps: each event names its own
stall's place (an earlier episode's, not the record's latest), and quiet work after a rank's last step
that it came out of is no event (its time is shutdown), while a rank that ended stuck there is a HANG."""

from __future__ import annotations

import pytest

from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.stalls import HANG, find_stalls
from traceml_otel.analyze.window import StepWindow
from traceml_otel.wire.hang_record import HangRecord, StackFrame, StallEpisode

T0 = 1_700_000_000.0
STEPS = 20
STALL_STEP, STALL_S = 12, 6.0


def _steps() -> list[StepTiming]:
    """20 steps of 10 ms, step 12 holding a 6-s stall."""
    steps, t = [], T0
    for number in range(STEPS):
        traced = 0.01 + (STALL_S if number == STALL_STEP else 0.0)
        steps.append(StepTiming(run_id="r", rank=0, step=number, start_unix_nano=int(t * 1e9),
                                traced_cpu=traced, input_wait_cpu=0.0, phase_calls=(1, 1, 0, 0),
                                phase_cpu=(0.004, 0.004, None, None)))
        t += traced + 0.001
    return steps


def _record(state: str, steps: list[StepTiming], where_kept: bool = True) -> HangRecord:
    """The record after the run: the step-12 stall (at train.py:69) as an earlier episode, its own the
    3 s of quiet work after the last step (at train.py:80)."""
    stall_at = steps[STALL_STEP].start_unix_nano / 1e9
    last_end = steps[-1].start_unix_nano / 1e9 + 0.01
    episode = StallEpisode(stall_at, STALL_S, STALL_STEP, True, "step", "train.py:69" if where_kept else "")
    resolved = last_end + 3.0 if state == "resolved" else None
    return HangRecord(rank=0, world_size=1, run_id="r", state=state, stalled_s=3.0, timeout_s=1.0, step=STEPS,
                      in_step=False, phase="between steps", written_at=last_end + 3.0, resolved_at=resolved,
                      location=StackFrame("/u/train.py", 80, "<module>", "time.sleep(3)"), earlier=(episode,))


def _events(record: HangRecord, steps: list[StepTiming]) -> list[tuple[int | None, str, bool]]:
    window = StepWindow((0,), tuple(s.step for s in steps), (tuple(steps),))
    return [(e.step, e.location, e.resolved) for e in find_stalls(window, [record]).events if e.kind == HANG]


@pytest.mark.parametrize("state", ["resolved", "hung"])
def test_each_stall_names_its_own_place_and_quiet_work_at_the_end_is_no_hang(state: str) -> None:
    steps = _steps()
    events = _events(_record(state, steps), steps)
    assert events[0] == (STALL_STEP, "train.py:69", True)  # the episode's place, not the record's latest
    if state == "resolved":
        assert events == [(STALL_STEP, "train.py:69", True)]  # the final save it came out of: shutdown
    else:
        assert events[1:] == [(STEPS, "train.py:80", False)]  # killed stuck after its last step


def test_an_episode_of_an_older_record_has_no_place_rather_than_a_wrong_one() -> None:
    steps = _steps()
    assert _events(_record("resolved", steps, where_kept=False), steps) == [(STALL_STEP, "", True)]
