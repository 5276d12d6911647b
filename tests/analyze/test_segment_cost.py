"""The prefix-sum L2 cost gives ruptures' own ``l2`` cost, and so PELT's cuts, on the series it is handed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import ruptures
from ruptures.exceptions import NotEnoughPoints

from traceml_otel.analyze.segment_cost import prefix_sum_l2_cost


def _series(rng: random.Random, points: int, columns: int) -> np.ndarray:
    """Piecewise-constant columns with noise, at an offset and scale like the noise-scaled signals'."""
    cuts = sorted(rng.sample(range(5, points - 5), rng.randint(0, 4)))
    matrix = np.empty((points, columns))
    for column in range(columns):
        offset = rng.choice([0.0, 10.0, 1e3, 1e5])
        level, start = offset, 0
        for end in [*cuts, points]:
            noise = [rng.gauss(0, 1) for _ in range(end - start)]
            matrix[start:end, column] = [level + n for n in noise]
            level = offset + rng.uniform(-8, 8)
            start = end
    return matrix


@pytest.mark.parametrize("seed", range(40))
def test_pelt_cuts_the_same_places_as_with_ruptures_l2(seed: int) -> None:
    rng = random.Random(seed)
    points = rng.randint(20, 400)
    matrix = _series(rng, points, rng.randint(1, 3))
    penalty = 4.0 * np.log(points) * matrix.shape[1]
    shortest = max(3, -(-points // 20))
    theirs = ruptures.Pelt(model="l2", min_size=shortest, jump=1).fit(matrix).predict(pen=penalty)
    search = ruptures.Pelt(custom_cost=prefix_sum_l2_cost(), min_size=shortest, jump=1)
    ours = search.fit(matrix).predict(pen=penalty)
    assert ours == theirs


def test_each_segments_cost_matches_and_a_short_one_is_refused() -> None:
    rng = random.Random(7)
    matrix = _series(rng, 120, 3)
    reference = ruptures.costs.CostL2().fit(matrix)
    cost = prefix_sum_l2_cost().fit(matrix)
    for start, end in [(0, 120), (0, 1), (5, 6), (3, 90), (60, 120), (119, 120)]:
        assert cost.error(start, end) == pytest.approx(reference.error(start, end), rel=1e-9, abs=1e-6)
    flat = prefix_sum_l2_cost().fit(np.full(10, 3.5))
    assert flat.error(0, 10) == 0.0  # never negative from rounding
    with pytest.raises(NotEnoughPoints):
        cost.error(4, 4)
