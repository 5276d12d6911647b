"""How often drift from metrics (``analyze --prometheus``) calls SLOWING on simulated bucket series.

    .venv/bin/python benchmarks/metric_drift_noise.py

From metrics each time bucket's mean step time stands for the steps done in it. This draws runs of
1,500 steps in 8, 20, 100 and 400 buckets whose means carry Gaussian noise (2 % a quiet machine, 8 % a
CPU hog beside it) and counts, over 400 runs each, the SLOWING verdicts of ``from_metrics._drift`` on:
an A/A run (no change: every SLOWING is false), a run with one 6x bucket in its middle (a stall: a
one-off event, never a trend) and a run whose second half is 30 % slower (a real drift).
"""

from __future__ import annotations

import random

from traceml_otel.analyze.from_metrics import _drift
from traceml_otel.analyze.kinds import DriftKind
from traceml_otel.analyze.sources.prometheus import MetricRun

TRIALS = 400
STEPS = 1500


def _slowing_share(rng: random.Random, buckets: int, noise: float, shift: float = 0.0,
                   stall: bool = False) -> float:
    slowing = 0
    done = tuple(round(STEPS * (i + 1) / buckets) for i in range(buckets))
    for _ in range(TRIALS):
        means = []
        for i in range(buckets):
            mean = 0.008 * (1 + rng.gauss(0, noise)) * (1 + (shift if i >= buckets // 2 else 0.0))
            means.append(mean * 6 if stall and i == buckets // 2 else mean)
        run = MetricRun("r", "sim", (), step_points=done, step_time_series=tuple(means))
        slowing += _drift(run).kind is DriftKind.SLOWING
    return slowing / TRIALS


def main() -> None:
    rng = random.Random(7)
    print("SLOWING verdicts over 400 simulated runs of 1,500 steps (share of runs)")
    print(f"{'buckets':>8} {'A/A 2%':>8} {'A/A 8%':>8} {'stall 8%':>9} {'+30% 8%':>8} {'+30% 2%':>8}")
    for buckets in (8, 20, 100, 400):
        row = (_slowing_share(rng, buckets, 0.02), _slowing_share(rng, buckets, 0.08),
               _slowing_share(rng, buckets, 0.08, stall=True), _slowing_share(rng, buckets, 0.08, 0.3),
               _slowing_share(rng, buckets, 0.02, 0.3))
        print(f"{buckets:>8} " + " ".join(f"{share:>8.1%}" for share in row))


if __name__ == "__main__":
    main()
