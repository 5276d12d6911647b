"""The cost budget of automatic deep captures: a capture must be small against what it watches.

A capture costs the training thread time in two parts (measured, ``docs/captures.md``):

- *profiling* (:func:`capture_cost_s` without the export): the profiler's start and stop and the captured
  steps' time over the rank's median before (their whole time without one): 10-60 ms and a few steps
  x1.2 on CPU;
- *the export*: ``torch.profiler`` parsing its events into Python objects, ``key_averages()`` and our
  summary, then the trace's write and gzip. It runs on the exporter thread, but the parse holds the GIL
  in long C++ calls: a training thread of 0.2 ms steps lost 150 ms to a 145 ms parse and summary (one
  step waited through all of it); the write is 2 ms, the gzip 8-40 ms with the GIL mostly free.

An automatic capture is allowed when

    spent by automatic captures so far + the next one's expected profiling cost <= allowance
    allowance = max(BUDGET_SHARE x training time, WASTE_SHARE x time the triggering anomaly wasted)

and its export runs at once only when the expected export fits the training-time share too; otherwise
it waits (the stopped profiler's results kept in memory) until that share covers it, or until the rank's
training ends (``traceml.shutdown()``), where it costs the training nothing. The anomaly's share pays
for the profiling only: an export's cost is the least predictable part (0.15 s idle, 3 s for a trace of
many small operators on a loaded machine), and it explains nothing sooner for being written mid-run.

- *training time*: wall time since the rank's first step (measured by the training process's poller).
- *wasted*: what the emitter's trigger measured of its own anomaly (``wasted_s`` in the request): the
  spikes' busy time over the rank's median, a slow period's (or a straggler's) excess over its level
  before, the residual above 30 % of the busy time (and 0.1 ms) a step. A capture may add at most
  ``WASTE_SHARE`` to the harm the anomaly has already done; a run without anomaly keeps the plain 1 %.
- *a capture's cost* (``cost_s`` in its summary): its profiling cost + its export's wall time when the
  export ran during training (an upper bound: the training thread cannot lose more than that window).
- *expected costs*: the rank's last measured ones, else :data:`DEFAULT_RUN_COST_S` for profiling and
  :data:`DEFAULT_COST_S` for the export.

``TRACEML_CAPTURE_BUDGET`` (default :data:`BUDGET_SHARE`) and ``TRACEML_CAPTURE_WASTE_SHARE`` (default
:data:`WASTE_SHARE`; ``0``: the training-time share alone) move the bound. A capture asked for by a
person (``traceml capture``, ``POST /capture``, the ``c`` key) is never refused nor its export delayed
for its cost; its summary says what it cost. Standard library only: the emitter reads the constants too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BUDGET_SHARE = 0.01
"""All automatic captures together may cost at most this share of the rank's training time so far..."""
WASTE_SHARE = 0.5
"""... or this share of the time the triggering anomaly has wasted, whichever is larger."""
DEFAULT_COST_S = 0.2
"""An export's expected cost to the training thread before this rank measured one (seconds)."""
DEFAULT_RUN_COST_S = 0.01
"""Profiling's expected cost (start, stop, captured steps' slowdown) before this rank measured one: 5-7 ms
measured on loops of 0.4-1 ms steps; stops of 13-54 ms on a VM at load 11-23 (``docs/captures.md``)."""
BUDGET = "budget"
"""The refusal reason's first word (``rank-R.capture-status.json``'s ``refused``)."""


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """A rank's automatic captures against the budget, as its trainer knows them."""

    spent_s: float
    """Measured cost of the automatic captures so far (profiling, and exports run during training)."""
    run_expected_s: float
    """The next capture's expected profiling cost."""
    export_expected_s: float
    """The next export's expected cost, were it run during training."""


def capture_cost_s(start_s: float, stop_s: float, step_ms: Sequence[float], baseline_ms: float | None,
                   export_s: float) -> float:
    """What one capture cost the training thread, in seconds (an upper bound; see the module)."""
    steps_s = sum(step_ms) / 1e3
    if baseline_ms and baseline_ms > 0:
        steps_s = max(0.0, steps_s - len(step_ms) * baseline_ms / 1e3)
    return max(0.0, start_s) + max(0.0, stop_s) + steps_s + max(0.0, export_s)


def allowance_s(train_s: float, wasted_s: float, share: float, waste_share: float) -> float:
    """What automatic captures may cost in all now: the larger of the two shares."""
    return max(share * max(0.0, train_s), waste_share * max(0.0, wasted_s))


def affordable(train_s: float, wasted_s: float, share: float, waste_share: float,
               expected_s: float = DEFAULT_RUN_COST_S, spent_s: float = 0.0) -> bool:
    """Whether one more automatic capture fits (the emitter asks for a steady anomaly only then)."""
    return spent_s + expected_s <= allowance_s(train_s, wasted_s, share, waste_share)


def budget_refusal(train_s: float, spent_s: float, expected_s: float, share: float, wasted_s: float = 0.0,
                   waste_share: float = 0.0) -> str | None:
    """Why an automatic capture does not fit the budget now (``None``: it fits). The words stay the same
    for one run (refusals are counted by them); the numbers go to the rank's status file."""
    if affordable(train_s, wasted_s, share, waste_share, expected_s, spent_s):
        return None
    anomaly = f", {waste_share:.4g} of the anomaly's" if waste_share > 0 else ""
    return f"{BUDGET} ({share:.4g} of the training time{anomaly})"


def export_now(train_s: float, use: BudgetUse, share: float) -> bool:
    """Whether an armed capture's export fits the training-time share during training (else it waits)."""
    return affordable(train_s, 0.0, share, 0.0, use.run_expected_s + use.export_expected_s, use.spent_s)
