"""Writes goodput_test.yml: promtool cases for the goodput and MFU rules and TraceMLGoodputLow.

Each run is one rank (two for the per-rank cases) whose traceml_time_seconds_total grows per minute
by the seconds given for each category, as the emitter counts them: start-up lands at the first step,
an evaluation when it ends, and each category is exported at 0 once before its first value. Shapes:

- startup:     a 20-minute start-up, then 90 % in steps: quiet (the start-up leaves the window first);
- final_eval:  2 h at 90 %, then a 30-minute final evaluation with no step, then the end: quiet;
- periodic:    a 6-minute evaluation every hour (10 %): quiet;
- low:         2 h at 90 %, then 70 % of the time between steps while still stepping: fires.

Run `python prometheus/tests/make_goodput_test.py` after changing a shape; tests/stack/test_render.py
checks the file is up to date.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

from make_drift_test import expanding

OUT = Path(__file__).with_name("goodput_test.yml")
MINUTES = 185
Minute = dict[str, float]  # category -> seconds counted in that minute (missing: no series yet)
STEADY = {"step.block": 54.0, "step.input_wait": 6.0}
ALWAYS = ("startup", "step.input_wait", "step.block", "between_steps", "stalled", "shutdown")


def startup(minute: int) -> Minute:
    if minute < 20:
        return {}
    return {"startup": 1200.0, **STEADY} if minute == 20 else dict(STEADY)


def final_eval(minute: int) -> Minute:
    if minute == 1:
        return {"startup": 60.0}
    if minute <= 120:
        return dict(STEADY)
    if minute == 151:
        return {"outside.evaluation": 1800.0}
    if minute == 153:
        return {"shutdown": 60.0}
    return {}


def periodic(minute: int) -> Minute:
    if minute == 1:
        return {"startup": 60.0}
    if minute % 60 < 6:  # evaluating: no step
        return {"outside.evaluation": 360.0} if minute % 60 == 5 else {}
    return dict(STEADY)


def low(minute: int) -> Minute:
    if minute == 1:
        return {"startup": 60.0}
    if minute <= 120:
        return dict(STEADY)
    return {"step.block": 16.0, "step.input_wait": 2.0, "between_steps": 42.0}


SHAPES: dict[str, Callable[[int], Minute]] = {
    "startup": startup, "final_eval": final_eval, "periodic": periodic, "low": low,
}
ENDS = {"final_eval": 154}


def series(run: str, shape: Callable[[int], Minute], rank: int = 0) -> list[tuple[str, str]]:
    """(series, values) of one rank: its time counter per category, its steps and its end marker.

    A category's first report is 0 (the emitter's FirstZero); what it counted by then shows a minute
    later, with the next report."""
    counted = [shape(minute) if minute else {} for minute in range(MINUTES + 1)]
    first = {name: 0 for name in ALWAYS}
    for minute, amounts in enumerate(counted):
        for name in amounts:
            first.setdefault(name, minute)
    labels = f'traceml_job="{run}", traceml_run_id="{run}", traceml_rank="{rank}"'
    end = ENDS.get(run)
    out = []
    for name, since in first.items():
        values: list[float | None] = [None] * since
        total = 0.0
        for minute in range(since, MINUTES + 1):
            total += counted[minute].get(name, 0.0)
            values.append(0.0 if minute == since else total)
        out.append((f'traceml_time_seconds_total{{{labels}, traceml_time_category="{name}"}}',
                    _values(values, end)))
    steps = [0.0]
    for minute in range(1, MINUTES + 1):
        steps.append(steps[-1] + (600.0 if counted[minute].get("step.block") else 0.0))
    out.append((f"traceml_step_duration_seconds_count{{{labels}}}", _values(steps, end)))
    ended = [0.0 if end is None or minute < end else 1.0 for minute in range(MINUTES + 1)]
    out.append((f"traceml_run_ended{{{labels}}}", _values(ended, None if end is None else end + 2)))
    return out


def _values(values: list[float | None], end: int | None) -> str:
    """Promtool values: '_' before the series exists, expanding segments after, none after ``end``."""
    end = MINUTES if end is None else min(end, MINUTES)
    present = [v for v in values[: end + 1] if v is not None]
    missing = len(values[: end + 1]) - len(present)
    return " ".join([*(["_"] * missing), expanding(present)])


def per_rank_series() -> list[tuple[str, str]]:
    """Run 'ranks': rank 0 at 90 % goodput and MFU 0.4; rank 1 at 45 % and an impossible MFU
    (FLOPs declared 10x too high for its peak); rank 2 has FLOPs but no known peak."""
    out = []
    for rank, block, between, flops, peak in ((0, 54.0, 0.0, 54.0 * 60 * 0.4e12 / 60, 1e12),
                                                (1, 27.0, 27.0, 60 * 1e12 * 2, 1e12),
                                                (2, 54.0, 0.0, 1e13, None)):
        labels = f'traceml_job="ranks", traceml_run_id="ranks", traceml_rank="{rank}"'
        time_rates = {"step.block": block, "step.input_wait": 6.0, "between_steps": between}
        for name, rate in time_rates.items():
            out.append((f'traceml_time_seconds_total{{{labels}, traceml_time_category="{name}"}}',
                        f"0+{rate:g}x60"))
        out.append((f"traceml_model_flops_total{{{labels}}}", f"0+{flops:g}x60"))
        if peak is not None:
            out.append((f"traceml_peak_flops{{{labels}}}", f"{peak:g}x60"))
        out.append((f"traceml_run_ended{{{labels}}}", "0x60"))
    return out


def main() -> None:
    lines = [f"      - series: '{name}'\n        values: {values}"
             for run, shape in SHAPES.items() for name, values in series(run, shape)]
    ranks = [f"      - series: '{name}'\n        values: {values}" for name, values in per_rank_series()]
    quiet = "".join(f"""
      - eval_time: {minute}m
        alertname: TraceMLGoodputLow
        exp_alerts: []""" for minute in (30, 60, 75, 100, 125, 140, 152, 155, 185))
    text = f"""\
# Generated by make_goodput_test.py (the shapes are described there); do not edit.
rule_files: [../recording.yml, ../alerts.yml]
evaluation_interval: 1m
group_eval_order: [traceml-recording, traceml-recording-rates, traceml-recording-means, \
traceml-recording-collectives, traceml-recording-communication, traceml-recording-drift, \
traceml-recording-dashboard, traceml-recording-time, traceml-recording-goodput, traceml-recording-mfu, \
traceml-recording-histogram, traceml-recording-goodput-window, traceml-recording-memory, \
traceml-recording-recurrence, traceml-alerts, traceml-pipeline-health]

tests:
  # Healthy shapes stay quiet, the low one fires (alert_rule_test filters by run below).
  - interval: 1m
    input_series:
{chr(10).join(line for line in lines if '"low"' not in line)}
    alert_rule_test:{quiet}

  - interval: 1m
    input_series:
{chr(10).join(line for line in lines if '"low"' in line)}
    alert_rule_test:
      - eval_time: 170m
        alertname: TraceMLGoodputLow
        exp_alerts: []
      - eval_time: 180m
        alertname: TraceMLGoodputLow
        exp_alerts:
          - exp_labels: {{severity: warning, traceml_job: low, traceml_run_id: low}}
            exp_annotations:
{textwrap.indent(ANNOTATIONS, " " * 14)}

  # Per rank: goodput, MFU, and the ranks whose MFU is a data problem, never a number.
  - interval: 1m
    input_series:
{chr(10).join(ranks)}
    promql_expr_test:
      - expr: round(run_rank:traceml_goodput:ratio, 0.001)
        eval_time: 30m
        exp_samples:
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks", traceml_rank="0"}}'
            value: 0.9
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks", traceml_rank="1"}}'
            value: 0.45
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks", traceml_rank="2"}}'
            value: 0.9
      - expr: round(run:traceml_goodput:ratio, 0.001)
        eval_time: 30m
        exp_samples:
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks"}}'
            value: 0.75
      - expr: round(run_rank:traceml_mfu:ratio, 0.001)
        eval_time: 30m
        exp_samples:
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks", traceml_rank="0"}}'
            value: 0.36
      - expr: round(run:traceml_mfu:ratio, 0.001)
        eval_time: 30m
        exp_samples:
          - labels: '{{traceml_job="ranks", traceml_run_id="ranks"}}'
            value: 0.36
      - expr: run:traceml_mfu_data_problems:count
        eval_time: 30m
        exp_samples:
          - labels: '{{__name__="run:traceml_mfu_data_problems:count", traceml_job="ranks",
              traceml_run_id="ranks"}}'
            value: 2
"""
    OUT.write_text(text)


ANNOTATIONS = """\
summary: "Run low: less than half of its time trains the model"
description: >-
  Over the last 1h only 26.67% of the run's wall time (all ranks) was inside training steps. The
  dashboard's "Where the job's time went" row shows which category took the rest: evaluate or
  checkpoint less often (or asynchronously), move logging and host syncs off the loop, or fix the
  data loader; `traceml analyze` on the run folder gives the same account with advice per category.
runbook_url: docs/observability-stack.md#tracemlgoodputlow
dashboard_url: http://127.0.0.1:3000/d/traceml-training?var-run_id=low"""

if __name__ == "__main__":
    main()
