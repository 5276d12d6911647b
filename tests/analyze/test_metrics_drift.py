"""Drift from metrics is judged on the run's steps, not its time buckets (``from_metrics.py``): a run
of 1,497 steps seen in 20 buckets was once "fewer than 50 aligned steps"."""

from __future__ import annotations

from traceml_otel.analyze.drift import detect_drift
from traceml_otel.analyze.from_metrics import _drift, per_step_series
from traceml_otel.analyze.kinds import DriftKind
from traceml_otel.analyze.sources.prometheus import MetricRun
from traceml_otel.report.units import drift_sentence


def _run(done: list[int], means: list[float]) -> MetricRun:
    return MetricRun("r", "test", (), step_points=tuple(done), step_time_series=tuple(means))


def test_each_bucket_stands_for_the_steps_done_in_it() -> None:
    assert per_step_series((3, 3, 7), (1.0, 2.0, 3.0)) == ([0, 1, 2, 3, 4, 5, 6], [1.0] * 3 + [3.0] * 4,
                                                         [0] * 3 + [2] * 4)
    steps, series, _ = per_step_series((100_000, 250_000), (1.0, 2.0), limit=1000)
    assert len(steps) == len(series) == 1000 and steps[:2] == [0, 250] and series[-1] == 2.0


def test_a_long_run_in_few_buckets_is_judged_like_the_spans() -> None:
    done = [round(1497 * (i + 1) / 20) for i in range(20)]
    stable = _drift(_run(done, [0.010] * 20))
    assert stable.kind is DriftKind.STABLE
    assert stable.baseline_steps is not None and stable.recent_steps == (1198, 1496)  # the last 20 % of steps
    slowing = _drift(_run(done, [0.010] * 10 + [0.014] * 10))
    assert slowing.kind is DriftKind.SLOWING
    assert slowing.change is not None and abs(slowing.change - 0.4) < 0.01
    assert slowing.since_step is not None and 700 <= slowing.since_step <= 800  # bucket 10 began at ~748


def test_a_short_run_is_still_not_judged() -> None:
    assert _drift(_run([10, 20, 30], [0.01, 0.01, 0.01])).kind is DriftKind.NOT_ENOUGH_STEPS


def test_a_healthy_run_in_few_noisy_buckets_is_stable() -> None:
    # The clean-clone CI's healthy_long under a changing load: a 1,500-step run in 8 buckets whose
    # means wander by a few tenths of a ms. The baseline band holds one bucket (6.6 ms), the recent
    # band one (7.75 ms): +17 %, while the steps' own medians moved 1 %. One bucket's noise (from
    # successive buckets' differences) makes that change no drift.
    done = [round(1500 * (i + 1) / 8) for i in range(8)]
    means = [0.0079, 0.0066, 0.0072, 0.0081, 0.0074, 0.0079, 0.0070, 0.00775]
    drift = _drift(_run(done, means))
    assert drift.change is not None and drift.change > 0.10
    assert drift.kind is DriftKind.STABLE, drift


def test_a_clear_slowdown_in_few_noisy_buckets_is_still_slowing() -> None:
    done = [round(1500 * (i + 1) / 8) for i in range(8)]
    means = [0.0079, 0.0076, 0.0078, 0.0081, 0.0150, 0.0155, 0.0148, 0.0152]
    assert _drift(_run(done, means)).kind is DriftKind.SLOWING


def test_a_run_whose_load_lifted_is_judged_on_each_bands_own_noise() -> None:
    # The clean-clone CI's healthy_long again: under a heavy load at first (~20 ms steps whose bucket
    # means wandered by a quarter), then alone (3.3 ms). The slow steps fill many time buckets, the quick
    # ones few; the spans read SPEEDING_UP (-83 %), the metrics once STABLE (-85 %): the slow buckets'
    # noise, taken as every bucket's, hid the change. Noise is a share of each band's level.
    slow = [0.022, 0.017, 0.029, 0.019, 0.026, 0.015, 0.024, 0.031, 0.018, 0.023, 0.016, 0.027, 0.021]
    quick = [0.0034, 0.0033, 0.0035]
    means = slow + quick
    per_bucket = [int(1 / m) for m in slow] + [0] * len(quick)
    per_bucket[len(slow):] = [(1500 - sum(per_bucket)) // 3] * 3
    done = [sum(per_bucket[: i + 1]) for i in range(len(means))]
    drift = _drift(_run(done, means))
    assert drift.change is not None and drift.change < -0.8
    assert drift.kind is DriftKind.SPEEDING_UP, drift
    aa = _drift(_run(done, [*slow, 0.021, 0.024, 0.019]))  # the same buckets, no lift: no drift
    assert aa.kind is DriftKind.STABLE, aa


def test_a_stable_verdict_from_few_buckets_says_what_it_rests_on() -> None:
    # The clean-clone CI's healthy_long once more: 1,500 steps in ~6 s at 2 s buckets, the load lifting
    # in the middle one. The span reader's 300 steps a band read SPEEDING_UP (-61 %); the metrics' one
    # or two buckets a band cannot tell that from their wander, and the report says so.
    done = [420, 900, 1500]
    drift = _drift(_run(done, [0.0086, 0.0081, 0.0048]))
    assert drift.kind is DriftKind.STABLE and drift.change is not None and drift.change < -0.4
    assert drift.band_buckets == (2, 1)
    sentence = drift_sentence(drift)
    assert "time buckets (2 early, 1 recent)" in sentence and "within their wander" in sentence
    twenty = _drift(_run([round(1500 * (i + 1) / 20) for i in range(20)], [0.010] * 20))
    assert twenty.band_buckets == (4, 4)  # 300-step bands over 75-step buckets
    steps = detect_drift(list(range(1500)), [0.0086] * 750 + [0.0034] * 750)
    assert steps.kind is DriftKind.SPEEDING_UP and steps.band_buckets is None
    assert "time buckets" not in drift_sentence(steps)
