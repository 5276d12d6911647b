"""The span budget end to end: a 2-rank gloo job under ``traceml run``, through the real rotel collector.

``TRACEML_OTLP_SPANS=sampled`` at 10 %: both ranks export the same step numbers of the consistent
sample, every planted slow step is exported by both ranks, the tracestate and the threshold
attribute arrive, the account prints kept / dropped by the budget / lost, and the local copy is whole.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.wire.export_stats import read_export_stats
from traceml_otel.wire.sampling_threshold import in_sample, threshold, threshold_hex

SCRIPT = Path(__file__).resolve().parent / "scripts" / "sampled_ddp.py"
REPO = Path(__file__).resolve().parents[2]
STEPS = 600
SLOW = (50, 233, 417, 555)


def test_a_sampled_two_rank_job_keeps_whole_waterfalls(stack, tmp_path: Path) -> None:
    receiver, collector = stack
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(
        TRACEML_RUNS_DIR=str(tmp_path / "runs"), OTEL_EXPORTER_OTLP_ENDPOINT=collector.grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_METRICS_EXPORTER="none", TRACEML_OTLP_SPANS="sampled",
        TRACEML_OTLP_SAMPLE_RATE="0.1", TRACEML_OTLP_SPAN_BUDGET="0", TRACEML_LIVE="off",  # exactly 10 %
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "sampled", "--nproc-per-node", "2",
         str(SCRIPT), "--steps", str(STEPS), "--slow", ",".join(map(str, SLOW))],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    run_dir = tmp_path / "runs" / "sampled"

    # The local copy is complete: every step of both ranks, whatever was sampled.
    local = read_run(run_dir)
    local_steps = defaultdict(dict)
    for span in local:
        if span.name == c.SPAN_STEP:
            local_steps[span.attributes[c.ATTR_RANK]][span.attributes[c.ATTR_STEP]] = span
    assert {rank: len(steps) for rank, steps in local_steps.items()} == {0: STEPS, 1: STEPS}
    stats = read_export_stats(run_dir).stats
    assert all(s.local_copy_complete for s in stats), stats
    first = min(local_steps[0])  # the step number of the loop's first iteration
    planted = {first + step for step in SLOW}
    assert all(local_steps[0][step].end_ns - local_steps[0][step].start_ns > 0.14e9 for step in planted)

    # What arrived through the collector: whole waterfalls, the same step numbers on both ranks.
    budget_dropped = sum(s.otlp_budget_dropped for s in stats)
    exported = sum(s.otlp_exported for s in stats)
    assert exported > 0 and budget_dropped > 0 and sum(s.otlp_dropped for s in stats) == 0
    received = receiver.wait_for_spans(exported, timeout=30)
    assert len(received) == exported
    assert exported + budget_dropped == len(local)  # every span either kept or dropped by the budget
    kept: dict[int, dict[int, str]] = defaultdict(dict)
    by_trace = defaultdict(list)
    for span in received:
        if span.span.name == c.SPAN_CAPTURE:  # a deep capture's own span: sent whole, outside the budget
            continue
        by_trace[span.trace_id].append(span)
        state = span.span.trace_state
        assert re.fullmatch(r"ot=th:[0-9a-f]{1,14};rv:[0-9a-f]{14}", state), state
        assert state.endswith(f"rv:{span.trace_id & ((1 << 56) - 1):014x}")
        if span.name == c.SPAN_STEP:
            th = span.attributes[c.ATTR_SAMPLING_THRESHOLD]
            assert state.startswith(f"ot=th:{th};")
            kept[span.attributes[c.ATTR_RANK]][span.attributes[c.ATTR_STEP]] = th
    sample = {step: in_sample(c.step_trace_id("sampled", step), threshold(0.1)) for step in local_steps[0]}
    for rank in (0, 1):
        assert {step for step, yes in sample.items() if yes} <= set(kept[rank])  # both ranks, same steps
        assert all(th == threshold_hex(threshold(0.1)) for step, th in kept[rank].items()
                   if sample[step] and th != "0")
        assert all(kept[rank][step] == "0" for step in planted)  # every planted slow step, on both ranks
    local_children = defaultdict(int)
    for span in local:
        if span.parent_span_id:
            local_children[span.attributes[c.ATTR_RANK], span.attributes[c.ATTR_STEP]] += 1
    for spans in by_trace.values():  # each kept step's spans all arrived: its root and its children
        for root in [s for s in spans if s.name == c.SPAN_STEP]:
            key = (root.attributes[c.ATTR_RANK], root.attributes[c.ATTR_STEP])
            assert sum(s.parent_span_id == root.span_id for s in spans) == local_children[key], key
    # The account: three numbers, and the budget's drops are never called loss.
    line = next(line for line in output.splitlines() if "span budget:" in line)
    assert f"{exported} spans kept, {budget_dropped} dropped by the span budget" in line, output
    assert "0 lost" in line and "lowest sample probability 0.1" in line
