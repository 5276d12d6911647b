"""The cost budget of automatic deep captures: a capture must be small against the training it watches.

A capture costs the training thread time: the profiler's start and stop, the captured steps' slowdown,
and the steps that share the CPUs (and the GIL) with the export thread while the trace is written. On a
short run that is a large share: a 3-step capture of 0.4 ms steps cost one step 121 ms, and neighbours
more, about 15 % of a one-second run. "Telemetry never harms training" therefore bounds automatic
captures by the training they watch:

    spent by automatic captures so far + the next one's expected cost <= BUDGET_SHARE x training time

- *training time*: wall time since the rank's first step (measured by the training process's poller).
- *a capture's cost* (:func:`capture_cost_s`, written as ``cost_s`` in its summary): the profiler's start
  and stop + the captured steps' time over the rank's median before (their whole time without one) +
  the export's wall time. The export runs on its own thread, and the training thread cannot lose more
  than the export's wall time to it: an upper bound, so the budget errs on the side of training.
- *the next one's expected cost*: the last capture's measured cost on this rank (automatic or on
  demand), or :data:`DEFAULT_COST_S` before any: a CPU capture of 3 small steps measured 0.15-2.4 s of
  export and 15-55 ms of start and stop (``docs/captures.md``), so 0.2 s is the cheap end; a run shorter
  than ``DEFAULT_COST_S / BUDGET_SHARE`` (20 s) takes no automatic capture at all.

``TRACEML_CAPTURE_BUDGET`` (a share, default :data:`BUDGET_SHARE`) moves the bound; ``1`` allows a
capture that costs as much as the training so far (tests of the triggers on short loops use it). A
capture asked for by a person (``traceml capture``, ``POST /capture``, the ``c`` key) is never refused
for its cost; its summary says what it cost. Standard library only: the emitter reads the constants too.
"""

from __future__ import annotations

from collections.abc import Sequence

BUDGET_SHARE = 0.01
"""All automatic captures together may cost at most this share of the rank's training time so far."""
DEFAULT_COST_S = 0.2
"""A capture's expected cost before this rank measured one (seconds of the training thread)."""
BUDGET = "budget"
"""The refusal reason's first word (``rank-R.capture-status.json``'s ``refused``)."""


def capture_cost_s(start_s: float, stop_s: float, step_ms: Sequence[float], baseline_ms: float | None,
                   export_s: float) -> float:
    """What one capture cost the training thread, in seconds (an upper bound; see the module)."""
    steps_s = sum(step_ms) / 1e3
    if baseline_ms and baseline_ms > 0:
        steps_s = max(0.0, steps_s - len(step_ms) * baseline_ms / 1e3)
    return max(0.0, start_s) + max(0.0, stop_s) + steps_s + max(0.0, export_s)


def affordable_after_s(share: float, spent_s: float = 0.0, expected_s: float = DEFAULT_COST_S) -> float:
    """The training time from which one more automatic capture fits the budget."""
    return (spent_s + expected_s) / share if share > 0 else float("inf")


def budget_refusal(train_s: float, spent_s: float, expected_s: float, share: float) -> str | None:
    """Why an automatic capture does not fit the budget now (``None``: it fits). The words stay the same
    for one run (refusals are counted by them); the numbers go to the rank's status file."""
    if spent_s + expected_s <= share * train_s:
        return None
    return f"{BUDGET} ({share:.4g} of the training time)"
