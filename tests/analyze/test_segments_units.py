"""Segments, stall events and straggler recurrence on synthetic step records (no processes)."""

from __future__ import annotations

import random

import pytest

from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.events import stalled_advice
from traceml_otel.analyze.kinds import RunKind
from traceml_otel.analyze.recurrence import CHRONIC, NONE, ROTATING, TRANSIENT, classify, window_size
from traceml_otel.analyze.run_model import LoadedRun, StepTiming
from traceml_otel.analyze.time_accounting import account_time
from traceml_otel.report.html import render_html
from traceml_otel.report.json_report import report_json
from traceml_otel.report.text import render_text

T0 = 1.7e9


def _steps(levels: list[float], ranks: int = 2, noise: float = 0.08, spikes: float = 0.02, seed: int = 0,
           residual: list[float] | None = None, slow_rank: dict[int, float] | None = None,
           stall: tuple[int, int, float] | None = None) -> list[StepTiming]:
    """DDP-like steps: ``levels[n]`` seconds per step; ``residual[n]`` share outside the phases;
    ``slow_rank[n]`` extra seconds on rank 1 (the others wait in backward); ``stall`` (rank, step, s)."""
    rnd = random.Random(seed)
    clock = [T0] * ranks
    out = []
    for n, level in enumerate(levels):
        late = (slow_rank or {}).get(n, 0.0)
        for r in range(ranks):
            f = level * max(0.2, 1 + rnd.gauss(0, noise)) * (3 if rnd.random() < spikes else 1)
            share = residual[n] if residual else 0.05
            wait = 0.02 * level
            own = f * (1 - share)
            fw, bw, op = 0.4 * own, 0.5 * own, 0.1 * own
            extra = 0.0
            if late:
                extra = late if r == 1 else 0.0
                bw += late if r != 1 else 0.0
            if stall and n == stall[1]:
                extra += stall[2] if r == stall[0] else 0.0
                bw += stall[2] if r != stall[0] else 0.0
            traced = fw + bw + op + f * share + extra
            start = int((clock[r] + wait) * 1e9)
            out.append(StepTiming("run", r, n, start_unix_nano=start, traced_cpu=traced, input_wait_cpu=wait,
                                  phase_calls=(1, 1, 1, 0), phase_cpu=(fw, bw, op, None), world_size=ranks,
                                  parallelism="ddp", between_cpu=wait))
            clock[r] += wait + traced
    return out


def _analyze(steps: list[StepTiming]):  # type: ignore[no-untyped-def]
    return analyze_run(LoadedRun("run", tuple(steps), "test"))


def test_a_period_28_percent_slower_is_labelled_the_same_from_either_side() -> None:
    """A steady part at 60 ms and a last third at 77 ms (+28 %): a real run under load measured this
    (its planted +40 % diluted by the load) and read "warm-up, steady, steady": the join kept the two
    apart (+28 % from the faster), but measured from the slower one they were 22 % apart, so the slow
    third counted the steady part's time as its own, became the reference, and the steady part was no
    period either. Apart is apart both ways: the steady part is the reference, the end a slow period."""
    levels = [0.3] * 10 + [0.06] * 88 + [0.0768] * 52
    for seed in range(3):
        analysis = _analyze(_steps(levels, noise=0.02, spikes=0.0, seed=seed))
        segments = analysis.segments.segments
        assert [s.label for s in segments] == ["warm-up", "steady", "slow period"], segments
        assert analysis.segments.reference == 1 and segments[2].change == pytest.approx(0.28, abs=0.05)


def test_compile_steady_then_forty_percent_slower_is_three_segments_verdict_of_the_steady_one() -> None:
    n = 300
    levels = [0.3] * 15 + [0.1] * 185 + [0.14] * 100
    residual = [0.05] * 200 + [0.35] * 100  # the slow third spends its extra time outside the model
    for seed in range(3):
        analysis = _analyze(_steps(levels, residual=residual, seed=seed))
        segments = analysis.segments.segments
        assert [s.label for s in segments] == ["warm-up", "steady", "slow period"], segments
        for seg, (first, last) in zip(segments, [(0, 14), (15, 199), (200, 299)], strict=True):
            assert abs(seg.first_step - first) <= 0.05 * n and abs(seg.last_step - last) <= 0.05 * n
        steady = segments[analysis.segments.reference]
        assert steady.label == "steady" and steady.verdict == "COMPUTE_BOUND"
        assert segments[2].verdict == "RESIDUAL_HEAVY" and segments[2].change == pytest.approx(0.4, abs=0.08)
        assert str(analysis.step.primary.kind) == steady.verdict  # never the whole-run average
        assert analysis.drift.segment_steps is not None and abs(analysis.drift.segment_steps[0] - 200) <= 15
        assert analysis.drift.segment_change == pytest.approx(0.4, abs=0.08)
        assert str(analysis.drift.kind) == "SLOWING" and not analysis.drift.from_segment  # the bands saw it
        document = report_json(analysis)
        assert [s["label"] for s in document["segments"]["segments"]] == ["warm-up", "steady", "slow period"]
        assert "Segments" in render_text(analysis) and "slow period" in render_text(analysis)
        assert "Segments and events" in render_html(analysis)


@pytest.mark.parametrize("slow_s", [0.9, 0.0])
def test_a_one_off_slow_step_never_makes_its_segment_the_reference(slow_s: float) -> None:
    """Step 5 takes 0.9 s more (a checkpoint saved inside the step: no stall, under a second) among 384
    steps of 2-3 ms, and holds most of the raw training time; the segment around it is still its first
    20 steps at their pace, so the reference (the verdict) is the run's ordinary steps, never that one
    step's forward. Without it the verdict is the same. (A compile at step 0 leaves as start-up first.)"""
    levels = [0.003] * 20 + [0.002] * 364
    residual = [0.05] * 20 + [0.30] * 364  # the ordinary steps spend 30 % outside the phases
    steps = _steps(levels, residual=residual, noise=0.03, spikes=0.0, seed=4)
    steps = [s._replace(traced_cpu=s.traced_cpu + slow_s, phase_cpu=(s.phase_cpu[0] + slow_s,
                                                                      *s.phase_cpu[1:]))
             if s.step == 5 else s for s in steps]
    analysis = _analyze(steps)
    assert analysis.window.startup_steps == 0 and analysis.stalls.events == ()
    found = analysis.segments
    reference = found.segments[found.reference]
    assert reference.first_step >= 15 and reference.typical_s < 0.0025, found.segments
    assert str(analysis.step.primary.kind) == "RESIDUAL_HEAVY" == reference.verdict
    if slow_s:
        assert found.segments[0].seconds > 0.5 * sum(s.seconds for s in found.segments)  # raw time: step 5
        assert "the verdict of steps" in render_text(analysis)


def test_a_phase_mix_change_at_the_same_speed_is_a_segment_but_not_drift() -> None:
    """The last third spends 35 % outside the phases at the same step time: a ``phase mix changed``
    segment, while the step time did not move, so drift stays STABLE (it once read SPEEDING_UP)."""
    levels = [0.1] * 300
    residual = [0.05] * 200 + [0.40] * 100
    analysis = _analyze(_steps(levels, residual=residual, seed=1))
    assert [s.label for s in analysis.segments.segments][-1] == "phase mix changed", analysis.segments
    assert str(analysis.drift.kind) == "STABLE", analysis.drift
    assert analysis.drift.segment_steps is not None  # the segment is still told with the drift
    assert analysis.drift.from_segment is False


def test_a_fast_period_ending_the_run_sets_the_drift_kind_and_says_so() -> None:
    """20 fast steps at the end are too few for the recent band's halves, so the kind comes from the
    segment, and the report says so (``from_segment``)."""
    analysis = _analyze(_steps([0.1] * 280 + [0.05] * 20, seed=2, noise=0.03, spikes=0.0))
    assert [s.label for s in analysis.segments.segments][-1] == "fast period", analysis.segments
    assert str(analysis.drift.kind) == "SPEEDING_UP" and analysis.drift.from_segment is True, analysis.drift
    assert report_json(analysis)["drift"]["from_segment"] is True


def _wander(n: int, phi: float, sigma: float, seed: int) -> list[float]:
    """A step time that wanders like a loaded machine's (AR(1) in its relative level)."""
    rnd = random.Random(seed)
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rnd.gauss(0, sigma * (1 - phi * phi) ** 0.5)
        out.append(0.1 * (1 + max(-0.5, x)))
    return out


@pytest.mark.parametrize("hog", [False, True])
def test_steady_runs_with_noise_spikes_and_wander_give_one_segment(hog: bool) -> None:
    spurious = []
    for seed in range(12):
        levels = _wander(400, 0.9 if hog else 0.5, 0.10, seed)
        noise, spikes = (0.25, 0.04) if hog else (0.08, 0.02)
        found = _analyze(_steps(levels, seed=seed, noise=noise, spikes=spikes)).segments.segments
        if len(found) != 1:
            spurious.append((seed, [(s.first_step, s.last_step, s.label) for s in found]))
    assert not spurious


def test_a_stall_is_an_event_never_a_straggler_and_is_billed_to_stalled() -> None:
    steps = _steps([0.01] * 60, noise=0.05, spikes=0.0, stall=(1, 30, 25.0))
    analysis = _analyze(steps)
    (event,) = analysis.stalls.events
    assert event.kind == "STALL" and event.ranks == (1,) and event.waiting == (0,) and event.step == 30
    assert event.seconds == pytest.approx(25.0, abs=0.5)
    assert not any(str(f.kind).endswith("STRAGGLER") for f in analysis.step.issues)
    assert analysis.ranks[0].steps == 59  # step 30 left out of the means
    (finding,) = [f for f in analysis.run_findings if f.kind == RunKind.STALL]
    assert "rank 1" in finding.title
    stalls = {}
    for part in event.parts:
        stalls.setdefault(part.rank, []).append((part.start, part.start + part.seconds))
    account = account_time(steps, {}, (), stalls=stalls)
    for rank in account.ranks:
        assert rank.seconds("stalled") == pytest.approx(25.0, abs=1.0)
        productive = sum(v for k, v in rank.categories if k.startswith("step.") and k != "step.input_wait")
        assert productive < 2.0
    (pointer,) = [f.advice for f in stalled_advice(account, analysis.run_findings).findings
                  if f.category == "stalled"]
    assert "see the STALL finding" in pointer and "HANG" not in pointer  # only findings that exist


def test_steps_without_a_stall_have_no_event() -> None:
    analysis = _analyze(_steps([0.01] * 80, noise=0.3, spikes=0.05))
    assert analysis.stalls.events == ()


@pytest.mark.parametrize(("culprits", "pattern"), [
    ([1, 1, 1, 1, 1, 1], CHRONIC), ([1, 1, None, 1, 1, 0], CHRONIC),
    ([0, 1, 0, 1, 0, 1], ROTATING), ([0, 1, 2, 3, 0, 1], ROTATING),
    ([None, None, 1, None, None, None], TRANSIENT), ([None] * 6, NONE),
])
def test_recurrence_patterns(culprits: list[int | None], pattern: str) -> None:
    assert classify(culprits) == pattern


@pytest.mark.parametrize(("culprits", "pattern", "since"), [
    ([None] * 4 + [1] * 6, CHRONIC, 4),  # slow from window 4 to the end: not a passing event
    ([None, None, 1, None, 1, 1, None, 1, 1, 1], CHRONIC, 2),  # two thirds from window 2 on
    ([None] * 7 + [1] * 3, CHRONIC, 7),
    ([None] * 8 + [1] * 2, TRANSIENT, None),  # two windows: too few to tell
    ([1, 1] + [None] * 8, TRANSIENT, None),  # it passed
    ([None, 0, 0, 0, 0, 0, None, 1, 1, 1], ROTATING, None),  # rank 0 before: the slow rank changed
    ([1] * 10, CHRONIC, None),  # chronic from the start
])
def test_a_rank_slow_from_a_window_to_the_end_is_chronic_since_then(
        culprits: list[int | None], pattern: str, since: int | None) -> None:
    from traceml_otel.analyze.recurrence import recurrence_of

    starts = [w * 49 for w in range(len(culprits))]
    found = recurrence_of(culprits, starts, 49)
    assert found.pattern == pattern
    assert found.since_step == (None if since is None else starts[since])
    if since is not None:
        assert f"since step {starts[since]}" in found.text and "still was at the end" in found.advice
    elif pattern == TRANSIENT:
        assert ("the last of them at the run's end" in found.advice) == (culprits[-1] is not None)


def test_window_size_is_fixed_at_one_hundred_steps_for_long_runs() -> None:
    assert window_size(300) == 30 and window_size(1000) == 100 and window_size(10**6) == 5000


@pytest.mark.parametrize(("plan", "pattern"), [
    ({n: 0.02 for n in range(300)}, CHRONIC),
    ({n: 0.02 for n in range(120, 180)}, TRANSIENT),
])
def test_recurrence_in_the_straggler_finding(plan: dict[int, float], pattern: str) -> None:
    analysis = _analyze(_steps([0.01] * 300, noise=0.05, spikes=0.0, slow_rank=plan))
    assert analysis.straggler_recurrence is not None and analysis.straggler_recurrence.pattern == pattern
    stragglers = [f for f in analysis.step.issues if str(f.kind).endswith("STRAGGLER")]
    for finding in stragglers:
        assert {e.name: e.value for e in finding.evidence}["recurrence"] == pattern
    assert report_json(analysis)["straggler_recurrence"]["pattern"] == pattern


def test_ranks_waiting_for_a_peers_outside_step_block_are_no_stall() -> None:
    steps = _steps([0.01] * 60, noise=0.05, spikes=0.0, stall=(1, 30, 8.0))
    # rank 1's 8 s were an outside_step block (a checkpoint): not in its step, so only rank 0's wait shows
    steps = [s._replace(traced_cpu=s.traced_cpu - 8.0) if s.rank == 1 and s.step == 30 else s for s in steps]
    analysis = _analyze(steps)
    assert analysis.stalls.events == ()


@pytest.mark.parametrize("end", [0.0048, 0.0035])
def test_a_slow_patch_holding_most_time_never_turns_the_runs_end_into_speeding_up(end: float) -> None:
    """Ten 200 ms steps of one slow rank among ~370 of 3.5 ms hold most of the training time, so that
    patch is the reference segment and the ordinary steps read "fast period" against it. Drift is
    the end against the early steps: a slower end (4.8 ms) is SLOWING, an ordinary one STABLE, never
    SPEEDING_UP (a real 2-rank run once read "speeding up: 4.1 ms recently vs 3.2 ms early (+30%)")."""
    levels = [0.0035] * 350 + [end] * 34
    analysis = _analyze(_steps(levels, noise=0.03, spikes=0.0, seed=3,
                               slow_rank={n: 0.2 for n in range(150, 160)}))
    found = analysis.segments
    patch = found.segments[found.reference]
    assert patch.first_step <= 150 <= patch.last_step and patch.typical_s > 0.1, found.segments
    drift = analysis.drift
    assert str(drift.kind) == ("SLOWING" if end > 0.004 else "STABLE"), drift
    text = render_text(analysis)
    assert "speeding up" not in text
    if end > 0.004:
        assert drift.from_segment and drift.since_step is not None and abs(drift.since_step - 350) <= 10
        assert "against the early steps" in text.replace("\n           ", " "), text
        assert report_json(analysis)["drift"]["segment_typical_s"] == pytest.approx(end, rel=0.1)
