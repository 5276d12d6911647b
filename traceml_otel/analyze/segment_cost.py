"""The L2 segment cost from prefix sums, for ``ruptures``' PELT.

``ruptures``' own ``CostL2`` takes the variance of the segment's slice for every candidate segment,
O(length) numpy work per call, and PELT on a steady 400-point series asks for tens of thousands of
segments (a steady series prunes little): about 0.6 s of the end-of-run diagnosis. The same cost,
``sum over columns of sum((x - mean)^2)`` over ``[start, end)``, is ``S2 - S1^2 / n`` from running
sums of each column and of its squares, O(columns) per call. Columns are centred first so the running
sums stay small and the subtraction loses nothing that matters against a penalty of tens of noise
units. ``ruptures`` keeps the search (``Pelt(custom_cost=...)``, its documented extension point); only
the cost function is ours. ``tests/analyze/test_segment_cost.py`` checks both give the same cuts.

numpy and ruptures are imported only when a search runs (``import traceml_otel.analyze`` loads no
third-party package; ``tests/test_import_direction.py``), so the class is made on first use.
"""

from __future__ import annotations

from functools import cache
from typing import Any


def prefix_sum_l2_cost() -> Any:
    """A new ``ruptures`` cost object: the ``l2`` cost (least squared deviation from the segment mean),
    O(columns) a segment."""
    return _cost_class()()


@cache
def _cost_class() -> type:
    import numpy as np
    from ruptures.base import BaseCost
    from ruptures.exceptions import NotEnoughPoints

    class PrefixSumL2Cost(BaseCost):
        model = "l2"

        def __init__(self) -> None:
            self.min_size = 1
            self.signal: np.ndarray | None = None
            """The fitted signal, ``(n_samples, n_features)`` (``Pelt.predict`` reads its length)."""
            self._sums: list[list[float]] = []
            self._squares: list[float] = []

        def fit(self, signal: np.ndarray) -> PrefixSumL2Cost:
            """Take the signal, ``(n_samples,)`` or ``(n_samples, n_features)``."""
            matrix = np.asarray(signal, dtype=float)
            if matrix.ndim == 1:
                matrix = matrix.reshape(-1, 1)
            self.signal = matrix
            centred = matrix - matrix.mean(axis=0)
            zero = np.zeros((1, centred.shape[1]))
            self._sums = np.concatenate([zero, np.cumsum(centred, axis=0)]).T.tolist()
            self._squares = np.concatenate([[0.0], np.cumsum((centred * centred).sum(axis=1))]).tolist()
            return self

        def error(self, start: int, end: int) -> float:
            """The cost of the segment ``[start, end)``."""
            count = end - start
            if count < self.min_size:
                raise NotEnoughPoints
            squares = self._squares[end] - self._squares[start]
            for sums in self._sums:
                total = sums[end] - sums[start]
                squares -= total * total / count
            return squares if squares > 0.0 else 0.0

    return PrefixSumL2Cost
