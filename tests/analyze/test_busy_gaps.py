"""Long gaps between steps that the training thread worked through (analyze/busy_gaps.py) on synthetic
steps and CPU samples: an unmarked evaluation is time between steps, never a STALL; a sleep, a gap the
samples do not cover, a stall inside the step and a gap a hang watchdog declared stay stalls; a peer
that waited for the work in its next collective is no straggler and no stall event either."""

from __future__ import annotations

import pytest

from traceml_otel.analyze.busy_gaps import GapCpu, busy_gaps_note
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.stalls import HANG, STALL, find_stalls
from traceml_otel.analyze.window import StepWindow
from traceml_otel.wire.cpu_record import CpuRecord
from traceml_otel.wire.hang_record import HangRecord

T0 = 1_700_000_000.0
STEPS, GAP_BEFORE, GAP_S, STEP_S = 40, 20, 4.0, 0.01


def _steps(rank: int, *, gap_in_step: bool = False, waits: bool = False) -> list[StepTiming]:
    """40 steps of 10 ms; step 20 comes after a 4-s gap (or holds it in its block, ``gap_in_step``;
    or, ``waits``, spends it in its DDP all-reduce waiting for a peer)."""
    steps, t = [], T0
    for number in range(STEPS):
        long = number == GAP_BEFORE
        gap = GAP_S if long and not gap_in_step and not waits else 0.001
        traced = STEP_S + (GAP_S if long and (gap_in_step or waits) else 0.0)
        t += gap
        backward = 0.004 + (GAP_S if long and waits else 0.0)
        steps.append(StepTiming(run_id="r", rank=rank, step=number, start_unix_nano=int(t * 1e9),
                                traced_cpu=traced, input_wait_cpu=0.0, between_cpu=gap,
                                phase_calls=(1, 1, 1, 0), phase_cpu=(0.003, backward, 0.002, None)))
        t += traced
    return steps


def _samples(rank: int, on_cpu_share: float, windows: int = 38) -> CpuRecord:
    """0.1-s samples: the 20 steps before the gap in one window each, then ``windows`` windows while 20
    steps had ended (the gap) with the thread on a CPU ``on_cpu_share`` of the time, then the rest."""
    rows, clock, on_cpu = [], 0, 0
    for ended in [*range(GAP_BEFORE), *[GAP_BEFORE] * windows, *range(GAP_BEFORE + 1, STEPS)]:
        clock += 100_000_000
        on_cpu += int(100_000_000 * (on_cpu_share if ended == GAP_BEFORE else 1.0))
        rows.append((ended, clock, on_cpu, 0, on_cpu, -1, -1, -1))
    return CpuRecord("r", rank, "schedstat", tuple(rows))


def _stalls(cpu: list[CpuRecord], *ranks: list[StepTiming], hangs: tuple[HangRecord, ...] = ()) -> object:
    window = StepWindow(tuple(s[0].rank for s in ranks), tuple(range(STEPS)), tuple(tuple(s) for s in ranks))
    return find_stalls(window, hangs, GapCpu(cpu))


def test_an_unmarked_evaluation_between_steps_is_work_not_a_stall() -> None:
    found = _stalls([_samples(0, 0.97)], _steps(0))
    assert found.events == () and [(g.rank, g.step) for g in found.busy_gaps] == [(0, GAP_BEFORE)]
    assert found.busy_gaps[0].busy_share == pytest.approx(0.97, abs=0.01)
    note = busy_gaps_note(found.busy_gaps)
    assert "1 long gap(s) between steps were work" in note and "rank 0 before step 20 4.0 s" in note
    assert "97 % of each" in note and 'traceml.outside_step("evaluation")' in note and "waits" not in note


@pytest.mark.parametrize("case", ["sleeps", "not sampled", "inside the step"])
def test_a_stall_stays_a_stall(case: str) -> None:
    cpu = {"sleeps": [_samples(0, 0.02)], "not sampled": [_samples(0, 0.97, windows=2)],
           "inside the step": [_samples(0, 0.97)]}[case]
    found = _stalls(cpu, _steps(0, gap_in_step=case == "inside the step"))
    assert [(e.kind, e.step) for e in found.events] == [(STALL, GAP_BEFORE)] and found.busy_gaps == ()


def test_a_gap_the_hang_watchdog_declared_stays_a_hang() -> None:
    steps = _steps(0)
    began = steps[GAP_BEFORE].start_unix_nano / 1e9 - GAP_S
    hang = HangRecord(rank=0, world_size=1, run_id="r", state="resolved", stalled_s=GAP_S, timeout_s=1.0,
                      step=GAP_BEFORE, in_step=False, phase="between steps", written_at=began + GAP_S,
                      resolved_at=began + GAP_S)
    found = _stalls([_samples(0, 0.97)], steps, hangs=(hang,))
    assert [(e.kind, e.step) for e in found.events] == [(HANG, GAP_BEFORE)] and found.busy_gaps == ()


def test_a_peer_waiting_for_the_work_is_left_out_of_the_means_and_billed_stalled() -> None:
    """Rank 0 evaluates between steps 19 and 20; rank 1 waits in step 20's all-reduce meanwhile."""
    found = _stalls([_samples(0, 0.97), _samples(1, 0.05)], _steps(0), _steps(1, waits=True))
    assert found.events == () and [(g.rank, g.step) for g in found.busy_gaps] == [(0, GAP_BEFORE)]
    assert [(p.rank, p.step) for p in found.waited_for_work] == [(1, GAP_BEFORE)]
    assert GAP_BEFORE in found.stalled_steps()  # never a straggler made of the peer's wait
