"""Plain loops without ``trace_step`` under ``traceml run``: steps inferred from the loop's own calls
match the same loop in ``trace_step`` blocks (count, phases, median duration), in one process.

Cases (tests/zero_code/scripts/loop_cases.py): evaluation inside the loop (a DataLoader), gradient
accumulation from a generator (no DataLoader), two optimizers stepping once each per iteration, and
Accelerate with gradient accumulation (``AcceleratedOptimizer.step``).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.zero_code.runner import ZeroCodeRun, traceml_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
UPDATES = 6


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ZeroCodeRun, list]:
    tmp = tmp_path_factory.mktemp("loops")
    run = traceml_run(tmp, SCRIPTS / "loop_cases.py", env={"WINDOWS_DIR": str(tmp)})
    return run, json.loads((tmp / "cases.json").read_text())


def _case_steps(run: ZeroCodeRun, windows: list, case: str, version: str) -> list:
    (start, end), = [(a, b) for name, v, a, b in windows if (name, v) == (case, version)]
    return [s for s in run.ranks[0].steps if start <= s.start_ns and s.end_ns <= end]


@pytest.mark.parametrize("case", ["eval", "accumulation", "two_optimizers", "accelerate"])
def test_inferred_steps_match_trace_step(loop_run: tuple[ZeroCodeRun, list], case: str) -> None:
    run, windows = loop_run
    rank = run.ranks[0]
    inferred = _case_steps(run, windows, case, "inferred")
    traced = _case_steps(run, windows, case, "trace_step")
    assert len(inferred) == len(traced) == UPDATES
    assert {s.attributes["traceml.step.source"] for s in inferred} == {"inferred"}
    assert {s.attributes["traceml.step.source"] for s in traced} == {"trace_step"}
    optimizers = 2 if case == "two_optimizers" else 1
    for steps in (inferred, traced):
        assert [s.attributes["traceml.optimizer.steps"] for s in steps] == [optimizers] * UPDATES
    for one, other in zip(inferred, traced, strict=True):
        if case == "two_optimizers":  # trace_step(discriminator) times its forwards; inference both models'
            assert set(rank.phases(one)) == set(rank.phases(other)) == {"forward", "backward", "optimizer"}
        else:
            assert Counter(rank.phases(one)) == Counter(rank.phases(other))
    # the steps' own durations: the forward sleeps 50 ms, so CPU load moves them little
    median = {name: statistics.median((s.end_ns - s.start_ns) / 1e6 for s in steps)
              for name, steps in (("inferred", inferred), ("traced", traced))}
    assert abs(median["inferred"] - median["traced"]) <= 0.05 * median["traced"], median


def test_evaluation_stays_outside_inferred_steps(loop_run: tuple[ZeroCodeRun, list]) -> None:
    run, windows = loop_run
    steps = _case_steps(run, windows, "eval", "inferred")
    forwards = defaultdict(int)
    for step in steps:
        forwards[step.span_id] = run.ranks[0].phases(step).count("forward")
    assert set(forwards.values()) == {1}  # the evaluation forwards after updates 3 and 6 are in no step
    # the time between steps is recorded on every step but each rank's first, and covers the evaluation
    gaps = [s.attributes.get("traceml.between_steps.cpu_duration") for s in steps]
    assert all(gap is not None and gap >= 0 for gap in gaps)
    assert gaps[3] >= 0.09, gaps  # evaluation (two 50 ms forwards) ran between steps 2 and 3
