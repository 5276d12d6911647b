"""Memory rules at their thresholds, step-time drift, and the slowest steps with trace ids."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.drift import detect_drift, typical
from traceml_otel.analyze.kinds import DriftKind, MemoryKind, Severity
from traceml_otel.analyze.memory import diagnose_memory
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.analyze.window import aligned_window, group_by_rank
from traceml_otel.contract import step_trace_id

GIB = 1 << 30
TOTAL = 80 * GIB


def memory_window(peaks: dict[int, list[int]], total: int = TOTAL, reserved_extra: int = 0):  # type: ignore[no-untyped-def]
    steps = [
        StepTiming("r", rank, n, peak_allocated=peak, peak_reserved=peak + reserved_extra, memory_total=total)
        for rank, series in peaks.items()
        for n, peak in enumerate(series)
    ]
    return aligned_window(group_by_rank(steps))


def test_cpu_run_is_no_gpu_and_short_run_is_not_diagnosed() -> None:
    cpu = aligned_window(group_by_rank([StepTiming("r", 0, n) for n in range(60)]))
    assert diagnose_memory(cpu).status is MemoryKind.NO_GPU
    short = memory_window({0: [GIB] * 49})
    result = diagnose_memory(short)
    assert result.status is MemoryKind.NOT_ENOUGH_STEPS and result.ranks[0].peak_reserved == GIB


@pytest.mark.parametrize(
    ("ratio", "severity"),
    [(0.9199, None), (0.92, Severity.WARNING), (0.9699, Severity.WARNING), (0.97, Severity.CRITICAL)],
)
def test_high_pressure_thresholds(ratio: float, severity: Severity | None) -> None:
    result = diagnose_memory(memory_window({0: [math.ceil(TOTAL * ratio)] * 60}))
    found = {f.kind: f.severity for f in result.findings}
    assert found.get(MemoryKind.HIGH_PRESSURE) is severity


@pytest.mark.parametrize(
    ("imbalance", "pressure", "severity"),
    [
        (0.19, 0.6, None),
        (0.20, 0.30, Severity.WARNING),
        (0.20, 0.29, None),
        (0.30, 0.50, Severity.CRITICAL),
        (0.30, 0.49, Severity.WARNING),
        (0.29, 0.60, Severity.WARNING),
    ],
)
def test_imbalance_thresholds(imbalance: float, pressure: float, severity: Severity | None) -> None:
    worst = math.ceil(TOTAL * pressure)
    median = math.floor(worst / (1 + imbalance))
    result = diagnose_memory(memory_window({0: [median] * 60, 1: [median] * 60, 2: [worst] * 60}))
    found = {f.kind: f.severity for f in result.findings}
    assert found.get(MemoryKind.IMBALANCE) is severity


def test_creep_and_rising() -> None:
    n = 100
    creeping = [10 * GIB + int(i * 0.02 * GIB) for i in range(n)]  # ~+1.5 GiB from band to band
    result = diagnose_memory(memory_window({0: creeping, 1: creeping}))
    assert result.status is MemoryKind.MEMORY_CREEP and result.findings[0].severity is Severity.WARNING
    assert result.growth_bytes is not None and result.growth_bytes >= GIB
    rising = [10 * GIB + i * (1 << 20) for i in range(n)]  # ~+75 MiB
    result = diagnose_memory(memory_window({0: rising, 1: rising}))
    assert result.status is MemoryKind.MEMORY_RISING and result.findings[0].severity is Severity.INFO
    flat = [10 * GIB] * n
    assert diagnose_memory(memory_window({0: flat, 1: flat})).status is MemoryKind.STABLE


def test_creep_needs_both_the_worst_and_the_median_series_to_rise() -> None:
    n = 100
    rising = [10 * GIB + int(i * 0.02 * GIB) for i in range(n)]
    flat = [12 * GIB] * n
    result = diagnose_memory(memory_window({0: rising, 1: flat, 2: flat}))
    assert MemoryKind.MEMORY_CREEP not in {f.kind for f in result.findings}


# --- drift --------------------------------------------------------------------------------------


def test_typical_ignores_spikes() -> None:
    assert typical([1.0, 1.01, 0.99, 1.0, 9.0, 1.02, 0.98]) == pytest.approx(1.0)


def test_drift_slowing_from_a_step() -> None:
    steps = list(range(200))
    series = [0.010 if n < 120 else 0.013 for n in steps]
    series[3] = 0.5  # an early spike does not move the baseline
    drift = detect_drift(steps, series)
    assert drift.kind is DriftKind.SLOWING
    assert drift.change == pytest.approx(0.3)
    assert drift.since_step is not None and abs(drift.since_step - 120) <= 2


def test_drift_stable_speeding_up_and_too_short() -> None:
    steps = list(range(100))
    assert detect_drift(steps, [0.01] * 100).kind is DriftKind.STABLE
    assert detect_drift(steps, [0.01 if n < 50 else 0.008 for n in steps]).kind is DriftKind.SPEEDING_UP
    assert detect_drift(steps[:19], [0.01] * 19).kind is DriftKind.NOT_ENOUGH_STEPS


def test_drift_is_measured_over_the_whole_run_and_worst_steps_carry_trace_ids(tmp_path: Path) -> None:
    steps = [
        SyntheticStep(
            rank=r, step=n, forward=0.004 if n < 60 else 0.008, residual=0.05 if (n, r) == (42, 1) else 0.0005
        )
        for r in range(2)
        for n in range(100)
    ]
    loaded = FileSpanSource([write_run(tmp_path / "run", "drifty", steps)]).load()
    analysis = analyze_run(loaded)
    assert analysis.drift.kind is DriftKind.SLOWING and abs((analysis.drift.since_step or 0) - 60) <= 3
    worst = analysis.worst_steps[0]
    assert (worst.step, worst.rank, worst.dominant) == (42, 1, "residual")
    assert worst.trace_id == f"{step_trace_id('drifty', 42):032x}"
    assert len(analysis.worst_steps) == 5
    assert len(analysis.series) == 2 and analysis.series[0].steps[0] == 0


def test_noisy_steady_runs_are_not_drift() -> None:
    """Jitter, scheduler spikes, a slow warm-up and a slow last step are not a trend."""
    import random

    for seed in range(200):
        rng = random.Random(seed)
        n = rng.choice([50, 64, 100, 150, 300])
        series = [0.002 * rng.lognormvariate(0, 0.35) for _ in range(n)]
        for i in range(rng.randint(0, 8)):  # warm-up: the first steps are several times slower
            series[i] *= 4 + rng.random() * 4
        for _ in range(n // 10):  # scattered scheduler spikes
            series[rng.randrange(n)] *= 3
        series[-1] *= 5
        drift = detect_drift(list(range(n)), series)
        assert drift.kind is DriftKind.STABLE, (seed, n, drift)


def test_a_real_change_is_found_through_the_noise() -> None:
    import random

    rng = random.Random(7)
    series = [0.002 * rng.lognormvariate(0, 0.1) * (1.3 if n >= 60 else 1.0) for n in range(100)]
    drift = detect_drift(list(range(100)), series)
    assert drift.kind is DriftKind.SLOWING and abs((drift.since_step or 0) - 60) <= 5


def test_a_burst_in_part_of_the_recent_band_is_not_a_trend() -> None:
    series = [0.01] * 100
    for n in range(90, 100):  # the last 10 steps only: half of the recent band
        series[n] = 0.02
    assert detect_drift(list(range(100)), series).kind is DriftKind.STABLE
