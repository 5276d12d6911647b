"""The training loop the launch tests' scripts share: a tiny model's steps, each padded to ``step_ms``
by spinning (a busy, not a sleeping, training thread)."""

import time
from collections.abc import Callable

import torch
from torch import nn

import traceml_otel as traceml


class BusySteps:
    """The model and optimizer, made up front (their first use costs time a timed loop must not see)."""

    def __init__(self, step_ms: float) -> None:
        torch.set_num_threads(1)
        self.model = nn.Linear(8, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(4, 8)
        self.step_ns = int(step_ms * 1e6)

    def run(self, steps: int, before_step: Callable[[int], None] | None = None) -> None:
        """``steps`` traced steps of at least ``step_ms`` each; ``before_step(n)`` runs outside step ``n``."""
        for step in range(steps):
            if before_step is not None:
                before_step(step)
            with traceml.trace_step(self.model):
                begin = time.perf_counter_ns()
                self.optimizer.zero_grad()
                self.model(self.x).sum().backward()
                self.optimizer.step()
                while time.perf_counter_ns() - begin < self.step_ns:
                    pass
