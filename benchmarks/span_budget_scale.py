"""Spans per second a 1,024-rank job sends over OTLP, against the span budget (not a timed test).

Each simulated rank runs the emitter's own :class:`~traceml_otel.emit.span_budget.SpanBudget` on its
steps, in emitter-sized batches: steps of ``1/steps_per_s`` seconds with a little per-rank noise,
``--spans`` spans a step, and a few slow steps planted on one rank (the others wait for it in the
collective, so they are slow on every rank). Printed per step rate:

- the job's spans/s with every span (``all``) and under the budget (``auto``, the default), after the
  first epochs measured the rate;
- the probability the ranks settled on, and how many ranks ended on another one;
- kept steps kept by every rank (whole waterfalls) and planted slow steps kept by every rank.

    python benchmarks/span_budget_scale.py [--ranks 1024] [--steps 1024] [--budget 5000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from traceml_otel import contract as c
from traceml_otel.emit.span_budget import BudgetSettings, SpanBudget
from traceml_otel.step_records import StepRecord

BATCH = 64


def simulate(ranks: int, steps: int, steps_per_s: float, spans: int, budget_spans: float,
             slow: set[int]) -> dict[str, object]:
    step_ns = int(1e9 / steps_per_s)
    trace_ids = [c.step_trace_id("fleet", step) for step in range(steps)]
    kept_by_step: Counter[int] = Counter()
    probabilities: Counter[float] = Counter()
    kept_spans_after_warmup = 0
    warmup = 4 * 64
    for rank in range(ranks):
        rng = random.Random(rank)
        budget = SpanBudget(BudgetSettings("auto", None, budget_spans), ranks)
        t = 0
        records = []
        for step in range(steps):
            duration = int(step_ns * (8.0 if step in slow else rng.uniform(0.97, 1.0)))
            records.append(StepRecord(step=step, start_ns=t, end_ns=t + duration, phases=()))
            t += max(duration, step_ns)
        for i in range(0, steps, BATCH):
            chunk = records[i:i + BATCH]
            decisions = budget.decide(chunk, trace_ids[i:i + BATCH], [spans] * len(chunk))
            for record, decision in zip(chunk, decisions or [True] * len(chunk), strict=True):
                if decision is not None:
                    kept_by_step[record.step] += 1
                    if record.step >= warmup:
                        kept_spans_after_warmup += spans
        probabilities[budget.probability] += 1
    measured_steps = steps - warmup
    sent = kept_spans_after_warmup / (measured_steps / steps_per_s)
    whole = sum(1 for count in kept_by_step.values() if count == ranks)
    return {
        "all": ranks * steps_per_s * spans,
        "sent": sent,
        "probabilities": dict(probabilities),
        "kept_steps": len(kept_by_step),
        "whole": whole,
        "slow_whole": sum(1 for step in slow if kept_by_step[step] == ranks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--spans", type=int, default=6, help="spans per step per rank")
    parser.add_argument("--budget", type=float, default=5000.0)
    parser.add_argument("--rates", default="0.5,2,10", help="steps per second to simulate")
    args = parser.parse_args()
    slow = {300, 555, 801}
    print(f"{args.ranks} ranks, {args.steps} steps, {args.spans} spans a step, "
          f"budget {args.budget:,.0f} spans/s")
    print("steps/s | all spans/s | sent spans/s (auto) | <= budget | p (ranks) | kept steps whole | "
          "slow whole")
    for rate in (float(r) for r in args.rates.split(",")):
        started = time.perf_counter()
        r = simulate(args.ranks, args.steps, rate, args.spans, args.budget, slow)
        probabilities = ", ".join(f"{p:g} ({n})" for p, n in sorted(r["probabilities"].items()))  # type: ignore[union-attr]
        print(f"{rate:7g} | {r['all']:11,.0f} | {r['sent']:19,.0f} | {r['sent'] <= args.budget!s:9} | "
              f"{probabilities} | {r['whole']}/{r['kept_steps']} | {r['slow_whole']}/{len(slow)}"
              f"   ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
