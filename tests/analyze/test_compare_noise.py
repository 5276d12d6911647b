"""The noise model of ``traceml compare`` on synthetic autocorrelated step series.

A/A pairs of AR(1) series (strongly autocorrelated, as steps on a busy machine are) must rarely be
called a change, and a 15 % shift must be caught; the naive per-step standard error, which ignores
the autocorrelation, is shown to fail the same A/A test, so the test can tell a wrong model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from traceml_otel.analyze.compare_interval import RunMean, change_interval, judge
from traceml_otel.analyze.compare_noise import MAX_BLOCKS, noise_from_json, noise_json, run_noise

PHI = 0.8
"""Lag-1 autocorrelation of the synthetic step times."""


def ar1(
    rng: np.random.Generator, n: int, mean: float = 0.01, cv: float = 0.1, phi: float = PHI
) -> np.ndarray:
    """``n`` step times around ``mean`` whose noise is AR(1) with coefficient ``phi`` (stationary ``cv``)."""
    shocks = rng.normal(0.0, cv * math.sqrt(1 - phi * phi), n)
    noise = np.empty(n)
    noise[0] = rng.normal(0.0, cv)
    for i in range(1, n):
        noise[i] = phi * noise[i - 1] + shocks[i]
    return mean * np.exp(noise - cv * cv / 2)  # positive, with mean ``mean``


def run_mean(series: np.ndarray) -> RunMean:
    noise = run_noise(list(range(len(series))), list(series))
    assert noise is not None
    blocks = np.asarray(noise.block_means)
    se = float(blocks.std(ddof=1)) / math.sqrt(len(blocks))
    return RunMean(float(blocks.mean()), se, len(blocks) - 1.0)


def verdicts(shift: float, trials: int, seed: int, runs: int = 1, between_cv: float = 0.0,
             allowance: float = 0.0, cv: float = 0.1) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        a = [run_mean(ar1(rng, 600, mean=0.01 * (1 + rng.normal(0, between_cv)), cv=cv))
             for _ in range(runs)]
        b = [run_mean(ar1(rng, 600, mean=0.01 * (1 + shift) * (1 + rng.normal(0, between_cv)), cv=cv))
             for _ in range(runs)]
        interval = change_interval("step_time", a, b, allowance_cv=allowance)
        assert interval is not None
        out.append(interval.verdict)
    return out


def test_a_a_pairs_of_autocorrelated_runs_are_rarely_called_a_change() -> None:
    """Batch means hold the false-alarm rate near its nominal 2.5 % per side even at lag-1
    correlation 0.8 and a step-time spread of 25 % (a busy machine), with no run-to-run allowance."""
    found = verdicts(0.0, 300, seed=1, cv=0.25)
    alarms = found.count("regression") + found.count("improvement")
    assert alarms <= 0.06 * len(found), found


def test_the_naive_standard_error_would_flap_on_the_same_runs() -> None:
    """The per-step standard error (as if steps were independent) gives intervals far too narrow."""
    rng = np.random.default_rng(2)
    alarms = 0
    for _ in range(100):
        a, b = ar1(rng, 600, cv=0.25), ar1(rng, 600, cv=0.25)
        naive = [RunMean(float(s.mean()), float(s.std(ddof=1)) / math.sqrt(len(s)), len(s) - 1.0)
                 for s in (a, b)]
        interval = change_interval("step_time", naive[:1], naive[1:], allowance_cv=0.0)
        assert interval is not None
        alarms += interval.verdict in ("regression", "improvement")
    assert alarms >= 10  # the wrong model is caught by the A/A test above


def test_a_15_percent_slowdown_is_a_regression() -> None:
    found = verdicts(0.15, 100, seed=3)
    assert found.count("regression") >= 95, found
    faster = verdicts(-0.15, 50, seed=4)
    assert faster.count("improvement") >= 47, faster


def test_several_runs_per_side_pool_the_spread_between_runs() -> None:
    """Runs that differ by 5 % from each other (the machine, not the code): one run per side without an
    allowance flaps; three per side, pooled, do not, and a 15 % slowdown is still caught."""
    single = verdicts(0.0, 100, seed=5, between_cv=0.05)
    assert single.count("regression") + single.count("improvement") >= 20
    pooled = verdicts(0.0, 100, seed=6, runs=3, between_cv=0.05)
    assert pooled.count("regression") + pooled.count("improvement") <= 6, pooled
    caught = verdicts(0.15, 60, seed=7, runs=3, between_cv=0.03)
    assert caught.count("regression") >= 50, caught


def test_one_run_per_side_gets_the_run_to_run_allowance_and_says_so() -> None:
    rng = np.random.default_rng(8)
    a, b = run_mean(ar1(rng, 600)), run_mean(ar1(rng, 600))
    with_allowance = change_interval("step_time", [a], [b])
    without = change_interval("step_time", [a], [b], allowance_cv=0.0)
    assert with_allowance is not None and without is not None
    assert with_allowance.half_width > without.half_width and not with_allowance.between_runs
    assert "run-to-run allowance" in with_allowance.method
    pooled = change_interval("step_time", [a, a], [b, b])
    assert pooled is not None and pooled.between_runs and "pooled t over 2+2 runs" in pooled.method


def test_a_run_whose_own_blocks_spread_widely_gets_that_much_allowance() -> None:
    """A run alone on its side whose block means differ by 20 % from each other is no closer than that
    to a rerun: its allowance is its spread, so a +25 % A/A difference between a noisy and a calm run
    is inconclusive, while the same difference between two calm runs is a regression."""
    calm = RunMean(1.0, 0.005, 40.0, 0.0, 0.02)
    noisy = RunMean(1.25, 0.03, 40.0, 0.0, 0.20)
    assert noisy.allowance == pytest.approx(0.20) and calm.allowance == pytest.approx(0.025)
    interval = change_interval("step_time", [calm], [noisy])
    assert interval is not None and interval.verdict == "inconclusive", interval
    calm_b = RunMean(1.25, 0.00625, 40.0, 0.0, 0.02)
    interval = change_interval("step_time", [calm], [calm_b])
    assert interval is not None and interval.verdict == "regression", interval


def test_a_busier_machine_never_makes_a_regression_but_an_improvement_still_counts() -> None:
    """B ran beside other work (half the machine busy) and waited 20 % of its time for a CPU: a +20 %
    slowdown the load can explain is not a regression; a -30 % change on the busier machine is still an
    improvement, and the bound is one-sided (the quieter side's high end is not moved)."""
    quiet = RunMean(1.0, 0.005, 40.0, 0.0, 0.02, 0.05)
    busy_slower = RunMean(1.2, 0.006, 40.0, 0.2, 0.02, 0.55)
    interval = change_interval("step_time", [quiet], [busy_slower])
    assert interval is not None and interval.verdict == "inconclusive", interval
    assert "busier machine" in interval.method
    plain = change_interval("step_time", [RunMean(1.0, 0.005, 40.0, 0.0, 0.02)],
                            [RunMean(1.2, 0.006, 40.0, 0.2, 0.02)])
    assert plain is not None and interval.high == pytest.approx(plain.high)  # only the low end moved
    busy_faster = RunMean(0.7, 0.004, 40.0, 0.2, 0.02, 0.55)
    interval = change_interval("step_time", [quiet], [busy_faster])
    assert interval is not None and interval.verdict == "improvement", interval
    # the mirror: A was the busier one, so B's being faster may be the load, its being slower is not
    interval = change_interval("step_time", [busy_slower], [RunMean(0.96, 0.005, 40.0, 0.0, 0.02, 0.05)])
    assert interval is not None and interval.verdict == "inconclusive", interval


def test_interleaved_runs_whose_loads_differ_only_by_chance_get_no_load_bound() -> None:
    """Five runs per side on the same machine in turn: their loads differ by chance, and the pooled
    spread between runs holds that; a hog beside every B run is a systematic difference, bounded."""
    a = [RunMean(1.0 + d, 0.005, 40.0, 0.0, 0.02, load) for d, load in
         zip((0.01, -0.01, 0.0, 0.02, -0.02), (0.10, 0.30, 0.15, 0.25, 0.20), strict=True)]
    b = [RunMean(1.18 + d, 0.005, 40.0, 0.0, 0.02, load) for d, load in
         zip((0.01, -0.01, 0.0, 0.02, -0.02), (0.20, 0.35, 0.10, 0.30, 0.25), strict=True)]
    interval = change_interval("step_time", a, b)
    assert interval is not None and interval.verdict == "regression", interval
    assert "busier machine" not in interval.method
    hogged = [RunMean(r.mean, r.se, r.df, r.wait, r.spread, 0.6) for r in b]
    interval = change_interval("step_time", a, hogged)
    assert interval is not None and "busier machine" in interval.method and interval.verdict == "inconclusive"


@pytest.mark.parametrize(("low", "high", "verdict"), [
    (0.031, 0.2, "regression"), (-0.2, -0.03, "improvement"), (-0.029, 0.029, "equivalent"),
    (-0.01, 0.05, "inconclusive"), (-0.05, -0.01, "inconclusive"), (0.03, 0.04, "regression"),
])
def test_the_verdict_of_an_interval(low: float, high: float, verdict: str) -> None:
    assert judge(low, high) == verdict


def test_blocks_are_bounded_and_round_trip_through_the_report() -> None:
    rng = np.random.default_rng(9)
    noise = run_noise(list(range(100_000)), list(ar1(rng, 100_000, phi=0.5)))
    assert noise is not None and len(noise.block_means) <= MAX_BLOCKS
    assert noise_from_json(noise_json(noise)) == noise
    assert run_noise(list(range(8)), [0.01] * 8) is None  # too few steps for an estimate
    assert run_noise(list(range(40)), [0.01] * 39 + [float("nan")]) is None


def _run_with_cpu(rng: np.random.Generator, cpu: float, load_level: float, label: str) -> object:
    """A run summary whose on-CPU time per step grows 20 % per busy CPU beside it (a loaded machine)."""
    from traceml_otel.analyze.compare_noise import RunNoise
    from traceml_otel.analyze.compare_summary import RunSummary

    load = np.clip(load_level + rng.normal(0, 0.3, 30), 0, 2)
    on_cpu = cpu * (1 + 0.2 * load) * np.exp(rng.normal(0, 0.01, 30))
    means = tuple(float(v) for v in ar1(rng, 30, mean=0.01, cv=0.02))
    steps = tuple(range(0, 300, 10))
    noise = RunNoise("batch means", 300, 0, 10, means, steps, tuple(s + 9 for s in steps),
                     tuple(float(v) for v in on_cpu), "schedstat", tuple(float(v) for v in load), 0.5)
    return RunSummary(label, label, "COMPUTE_BOUND", "info", "cpu", 300, 0.01, (), None, 16.0, 0.01 / 16,
                      noise=noise)


def test_on_cpu_time_is_compared_at_the_same_machine_load() -> None:
    """Identical code, B on a busier machine: its raw on-CPU time is ~18 % higher; at the same load
    the difference is gone."""
    from traceml_otel.analyze.compare_sides import intervals, load_adjusted, run_means

    rng = np.random.default_rng(11)
    a, b = _run_with_cpu(rng, 0.001, 0.2, "a"), _run_with_cpu(rng, 0.001, 1.2, "b")
    raw = change_interval("x", run_means([a], "sample", cpu=True), run_means([b], "sample", cpu=True),
                          allowance_cv=0.0)
    adjusted = load_adjusted([a], [b], "sample")
    assert raw is not None and adjusted is not None and raw.change > 0.12
    fair = change_interval("x", *adjusted, allowance_cv=0.0)
    assert fair is not None and abs(fair.change) < 0.03 and fair.verdict != "regression"
    _, cpu = intervals(a, b, "sample")
    assert cpu is not None and "adjusted to the same machine load" in cpu.method
    slower = _run_with_cpu(rng, 0.00115, 1.2, "c")  # 15 % more work, on the busier machine too
    worse = change_interval("x", *load_adjusted([a], [slower], "sample"), allowance_cv=0.0)
    assert worse is not None and worse.verdict == "regression" and 0.1 < worse.change < 0.2


def _interfered_run(rng: np.random.Generator, step: float, label: str) -> object:
    """A run of 3,000 steps of ``step`` seconds of its own work; a machine mood of the run's own (0-120 %
    more time on a random 10-90 % of its steps, as other tenants' interference adds) moves its mean by up
    to ~60 % between runs, never below its own work."""
    from traceml_otel.analyze.compare_summary import RunSummary

    share, extra = rng.uniform(0.1, 0.9), rng.uniform(0.0, 1.2)
    series = step * (1 + rng.normal(0, 0.005, 3000).clip(-0.01, 0.01))
    series = series * np.where(rng.random(3000) < share, 1 + extra * rng.random(3000), 1.0)
    noise = run_noise(list(range(3000)), list(series))
    assert noise is not None and len(noise.block_fast) == len(noise.block_means)
    mean = float(np.mean(series))
    return RunSummary(label, label, "COMPUTE_BOUND", "info", "cpu", 3000, mean, (), None, 16.0, mean / 16,
                      noise=noise)


def test_several_runs_whose_means_wander_are_judged_by_their_fast_steps() -> None:
    """Five runs a side whose means differ by tens of percent from run to run: the mean's interval cannot
    resolve a 15 % change, the fast steps' can, so it is a regression; identical sides never are."""
    from traceml_otel.analyze.compare_judged import Change, judged_time
    from traceml_otel.analyze.compare_sides import pool_side

    rng = np.random.default_rng(21)
    point = Change("time_per_sample", None, None, None, "inconclusive")
    caught, by_fast, alarms = 0, 0, 0
    for trial in range(10):
        a = pool_side([_interfered_run(rng, 0.001, f"a{trial}{i}") for i in range(5)], "A")
        b = pool_side([_interfered_run(rng, 0.00115, f"b{trial}{i}") for i in range(5)], "B")
        same = pool_side([_interfered_run(rng, 0.001, f"c{trial}{i}") for i in range(5)], "C")
        change, decider, _, _, notes = judged_time(a, b, "sample", point)
        caught += change.verdict == "regression"
        by_fast += decider is not None and decider.name.startswith("fast")
        alarms += judged_time(a, same, "sample", point)[0].verdict == "regression"
        if decider is not None and decider.name.startswith("fast"):
            assert any("fast steps" in n for n in notes) and 0.10 < change.change < 0.20
    assert caught >= 9 and by_fast >= 5 and alarms == 0, (caught, by_fast, alarms)


def _contended_side(rng: np.random.Generator, step: float, on_cpu: float, wait: float, others: float,
                    label: str) -> object:
    """A run of 300 steps of ``step`` s (wall) and ``on_cpu`` s on-CPU, waiting ``wait`` of its wall
    time for a CPU, beside ``others`` of the machine's 2 CPUs busy with work outside the run."""
    from traceml_otel.analyze.compare_noise import RunNoise
    from traceml_otel.analyze.compare_summary import RunSummary

    starts = tuple(range(0, 300, 10))
    means = tuple(float(v) for v in step * np.exp(rng.normal(0, 0.01, 30)))
    cpu = tuple(float(v) for v in on_cpu * np.exp(rng.normal(0, 0.01, 30)))
    noise = RunNoise("batch means", 300, 0, 10, means, starts, tuple(s + 9 for s in starts), cpu, "schedstat",
                     tuple([1.0 + 2 * others] * 30), wait, 2, (), tuple([2 * others] * 30))
    return RunSummary(label, label, "COMPUTE_BOUND", "info", "cpu", 300, step, (("forward", step / 2),), None,
                      noise=noise)


@pytest.mark.parametrize(("others_b", "wait_b", "verdict"), [
    (0.5, 0.45, "INCONCLUSIVE"),  # a hog beside B: its spinning threads' on-CPU time rose with the wall
    (0.05, 0.02, "REGRESSION"),  # the same slowdown on an equally quiet machine: the code's
    (0.5, 0.03, "REGRESSION"),  # other work beside B, but B never waited for a CPU: the code's
])
def test_a_slower_run_beside_other_work_that_waited_for_a_cpu_is_not_judged(
        others_b: float, wait_b: float, verdict: str) -> None:
    """An A/A pair whose second run shared the machine with a CPU hog: torch's intra-op threads spun
    while waiting for a CPU, so its wall (+600 %) and on-CPU (+3,700 %) time both rose. That is the
    machine's load, not the code: INCONCLUSIVE, said in a note (it was REGRESSION, "the code's work
    changed"); the same change without the other work or without the waiting stays a REGRESSION."""
    from traceml_otel.analyze.compare_noise import noise_from_json, noise_json
    from traceml_otel.analyze.compare_policy import compare_runs

    rng = np.random.default_rng(5)
    a = _contended_side(rng, 0.0123, 0.0005, 0.02, 0.04, "a")
    b = _contended_side(rng, 0.0866, 0.019, wait_b, others_b, "b")
    comparison = compare_runs(a, b)
    assert comparison.verdict == verdict, (comparison.verdict, comparison.notes)
    said = [n for n in comparison.notes if "shared the machine with other work" in n]
    forward = {p.name: p.verdict for p in comparison.phases}["forward"]
    assert forward == ("inconclusive" if verdict == "INCONCLUSIVE" else "regression"), comparison.phases
    assert bool(said) == (verdict == "INCONCLUSIVE"), comparison.notes
    if said:
        assert "the second run" in said[0] and "50 % of its CPUs busy outside" in said[0]
        assert "waited for a CPU 45 %" in said[0]
    noise = b.noise  # type: ignore[attr-defined]
    assert noise_from_json(noise_json(noise)) == noise  # the other work survives the report


def test_phase_rows_are_judged_with_the_noise_of_the_deciding_time() -> None:
    """An A/A pair of real quickstart runs read INCONCLUSIVE (+-10.6 %) while its phase rows said
    "improvement" for -5 to -6 % changes (a fixed 3 % threshold, no noise): a phase is part of the step
    and no steadier than it. Within that noise the rows are inconclusive; a 60 % slower forward is a
    regression whatever the noise."""
    from traceml_otel.analyze.compare_policy import compare_runs
    from traceml_otel.analyze.compare_summary import RunSummary

    rng = np.random.default_rng(5)

    def side(label: str, forward: float, backward: float) -> RunSummary:
        series = ar1(rng, 300, mean=0.0007, cv=0.06)
        noise = run_noise(list(range(300)), list(series))
        phases = (("input_wait", 0.00028), ("forward", forward), ("backward", backward),
                  ("optimizer", 7.5e-5), ("residual", 7.8e-5))
        mean = float(np.mean(series))
        return RunSummary(label, label, "INPUT_BOUND", "critical", "cpu", 300, mean, phases, None, 64.0,
                          mean / 64, noise=noise)

    same = compare_runs(side("a", 1.08e-4, 1.79e-4), side("b", 1.05e-4, 1.70e-4))
    rows = {p.name: p.verdict for p in same.phases}
    assert same.interval is not None and same.interval.half_width > 0.06, same.interval
    assert rows["backward"] == rows["forward"] == "inconclusive", rows
    assert not any(p.material for p in same.phases)
    slower = compare_runs(side("a", 1.08e-4, 1.79e-4), side("b", 1.73e-4, 1.79e-4))
    assert {p.name: p.verdict for p in slower.phases}["forward"] == "regression", slower.phases
