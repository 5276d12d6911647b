"""The epoch anchor survives a preemption between its clock reads (a loaded host)."""

from __future__ import annotations

import time

import pytest

from traceml_otel.capture import clock_anchor
from traceml_otel.capture.clock_anchor import wall_anchor_ns

TRUE_ANCHOR_NS = 1_700_000_000_000_000_000


class ScriptedClocks:
    """A monotonic clock and a wall clock ``TRUE_ANCHOR_NS`` apart; ``stalls[i]`` ns pass (the process
    is descheduled) just before the wall clock's ``i``-th read."""

    def __init__(self, stalls: list[int]) -> None:
        self.now, self.stalls, self.wall_reads = 10_000, stalls, 0

    def perf_counter_ns(self) -> int:
        self.now += 300  # a read costs a little
        return self.now

    def time_ns(self) -> int:
        self.now += self.stalls[self.wall_reads] if self.wall_reads < len(self.stalls) else 0
        self.wall_reads += 1
        self.now += 300
        return self.now + TRUE_ANCHOR_NS


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch):
    def install(stalls: list[int]) -> ScriptedClocks:
        scripted = ScriptedClocks(stalls)
        monkeypatch.setattr(time, "perf_counter_ns", scripted.perf_counter_ns)
        monkeypatch.setattr(time, "time_ns", scripted.time_ns)
        return scripted
    return install


def test_a_stall_before_one_wall_read_does_not_move_the_anchor(clocks) -> None:
    scripted = clocks([5_000_000, 0, 7_000_000, 0, 0])  # 5 ms and 7 ms descheduled on two reads
    anchor = wall_anchor_ns()
    assert scripted.wall_reads == clock_anchor.ANCHOR_READS
    # the naive ``time_ns() - perf_counter_ns()`` after a 5 ms stall would be 5 ms off; this is
    # within half the tightest bracket (600 ns wide)
    assert abs(anchor - TRUE_ANCHOR_NS) <= 300


def test_every_read_stalled_still_gives_the_least_stalled_estimate(clocks) -> None:
    clocks([4_000_000, 2_000_000, 3_000_000])
    assert abs(wall_anchor_ns(reads=3) - TRUE_ANCHOR_NS) <= 2_000_000 // 2 + 300


def test_the_anchor_puts_a_monotonic_reading_on_the_epoch_clock() -> None:
    # the sign and the units: anchor + perf_counter_ns() is now on the wall clock (1 s: any load)
    assert abs(wall_anchor_ns() + time.perf_counter_ns() - time.time_ns()) < 1_000_000_000
