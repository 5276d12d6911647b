"""torch.compile'd models under ``traceml run`` (tests/zero_code/test_compiled_models.py).

Phase "inferred": a plain loop (no trace_step) calling ``torch.compile(model)``, then one calling a
model compiled in place (``model.compile()``; found by its eager entry, no hook sees it). Phase "explicit":
``trace_step(model)`` around ``torch.compile(model, fullgraph=True)`` (the inner model traced, so its
hooks sit inside the compiled region), then around a model compiled in place
(``model.compile(fullgraph=True)``: its hooks and the global ones are compiled with it). Every
warning is kept (``always``: each emission counts) and written with Dynamo's counters to argv[1].
"""

import json
import sys
import time
import warnings

import torch
import torch._dynamo.utils as dynamo_utils
from torch import nn

STEPS = 6  # more than step inference's warm-up (3 steps)


class Net(nn.Module):
    """A model class of the user's (Dynamo traces its forward, unlike ``nn.Sequential``'s)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(call, optimizer, step=None) -> None:
    for _ in range(STEPS):
        x = torch.randn(8, 16)
        with step() if step is not None else _nothing():
            optimizer.zero_grad()
            call(x).sum().backward()
            optimizer.step()


class _nothing:
    def __enter__(self): return self
    def __exit__(self, *exc): return False


COMPILES = {"inferred": 0, "inferred_in_place": 0, "inner": 0, "in_place": 0}


def counting_backend(name: str):
    """Dynamo's eager backend, counting each graph compiled for ``name`` (a recompile counts again)."""
    def backend(graph_module, example_inputs):
        COMPILES[name] += 1
        return graph_module.forward
    return backend


result = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model, optimizer = build()
    compiled = torch.compile(model, backend=counting_backend("inferred"))
    start = time.time_ns()
    train(compiled, optimizer)
    result["window"] = [start, time.time_ns()]
    del optimizer  # one optimizer alive per loop: each update is one inferred step
    time.sleep(0.12)  # the test's windows allow 50 ms of clock skew: keep the loops' steps apart
    model, optimizer = build()
    model.compile(backend=counting_backend("inferred_in_place"), fullgraph=True)
    start = time.time_ns()
    train(model, optimizer)
    result["window_in_place"] = [start, time.time_ns()]
    del optimizer
    time.sleep(0.12)

    import traceml_otel as traceml  # an explicit step: inference stops, trace_step takes over

    inner, optimizer = build()
    compiled = torch.compile(inner, backend=counting_backend("inner"), fullgraph=True)
    start = time.time_ns()
    train(compiled, optimizer, lambda: traceml.trace_step(inner))
    result["window_inner"] = [start, time.time_ns()]
    time.sleep(0.12)
    in_place, optimizer = build()
    in_place.compile(backend=counting_backend("in_place"), fullgraph=True)
    start = time.time_ns()
    train(in_place, optimizer, lambda: traceml.trace_step(in_place))
    result["window_explicit_in_place"] = [start, time.time_ns()]
result["compiles"] = COMPILES
result["graph_breaks"] = dict(dynamo_utils.counters["graph_break"])
result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
with open(sys.argv[1], "w") as out:
    json.dump(result, out)
