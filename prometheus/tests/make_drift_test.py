"""Writes drift_test.yml: promtool cases for TraceMLStepTimeDrift on the shapes issue 6 names.

Each run is one rank that steps back to back: in minute m it takes s(m) traced seconds and
w(m) seconds of input wait per step, so it completes 60 / (s + w) steps. The cumulative
counters are written in promtool's expanding notation ('a+bxN': a, a+b, ..., N+1 samples),
one segment per stretch of equal increments. Run `python prometheus/tests/make_drift_test.py`
after changing a shape; tests/stack/test_render.py checks the file is up to date.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).with_name("drift_test.yml")
Shape = Callable[[int], tuple[float, float]]  # minute -> (traced s, input wait s) per step


def expanding(values: list[float]) -> str:
    """Cumulative values as expanding-notation segments."""
    segments, start = [], 0
    while start < len(values):
        end = start
        step = round(values[start + 1] - values[start], 4) if start + 1 < len(values) else 0.0
        while end + 1 < len(values) and round(values[end + 1] - values[end], 4) == step:
            end += 1
        segments.append(f"{values[start]:g}+{step:g}x{end - start}" if end > start else f"{values[start]:g}")
        start = end + 1
    return " ".join(segments)


def counters(shape: Shape, minutes: int) -> tuple[list[float], list[float], list[float]]:
    count, traced, wait = [0.0], [0.0], [0.0]
    for minute in range(1, minutes + 1):
        s, w = shape(minute)
        steps = round(60 / (s + w), 2) if s + w else 0.0  # 0: the rank no longer steps
        count.append(round(count[-1] + steps, 2))
        traced.append(round(traced[-1] + round(steps * s, 3), 3))
        wait.append(round(wait[-1] + round(steps * w, 3), 3))
    return count, traced, wait


def series(run: str, shape: Shape, minutes: int, ended: str | None = None, tail: str = "",
           head: str = "", job: str | None = None) -> list[str]:
    """One rank's counters; ``job`` is the job identity (default: the run id, i.e. none)."""
    count, traced, wait = counters(shape, minutes)
    labels = f'traceml_job="{job or run}", traceml_run_id="{run}", traceml_rank="0"'
    lines = []
    for name, values in (("traceml_step_duration_seconds_count", count),
                         ("traceml_step_duration_seconds_sum", traced),
                         ("traceml_step_input_wait_seconds_sum", wait)):
        lines += [f"      - series: '{name}{{{labels}}}'", f"        values: {head}{expanding(values)}{tail}"]
    ended = ended or f"0x{minutes}"
    lines += [f"      - series: 'traceml_run_ended{{{labels}}}'", f"        values: {head}{ended}"]
    return lines


def quiet(minutes: list[int]) -> list[str]:
    lines = []
    for minute in minutes:
        lines += [f"      - eval_time: {minute}m", "        alertname: TraceMLStepTimeDrift",
                  "        exp_alerts: []"]
    return lines


def firing(run: str, percent_at: dict[int, str], job: str | None = None) -> list[str]:
    """Cases where the alert fires; the value (current / baseline) is checked through the description."""
    lines = []
    for minute, percent in percent_at.items():
        description = (
            f"Step time (input wait + traced step) over the last 5m is {percent} of the baseline of job "
            f"{job or run} (its best sustained pace over its attempts: the 10th percentile of its 5m means). "
            "Compare input wait and the phases with the baseline period in the dashboard, and open a slow "
            "step's trace (exemplars); check the data loader, memory creep and other jobs on the hosts."
        )
        lines += [
            f"      - eval_time: {minute}m", "        alertname: TraceMLStepTimeDrift", "        exp_alerts:",
            "          - exp_labels:", "              severity: warning",
            f"              traceml_job: {job or run}",
            f"              traceml_run_id: {run}",
            "            exp_annotations:",
            f'              summary: "Run {run}: steps are slower than the job\'s own best pace"',
            "              description: >-",
            *textwrap.wrap(description, 100, initial_indent=" " * 16, subsequent_indent=" " * 16),
            "              runbook_url: docs/observability-stack.md#tracemlsteptimedrift",
            f"              dashboard_url: http://127.0.0.1:3000/d/traceml-training?var-run_id={run}",
        ]
    return lines


def steady(m: int) -> tuple[float, float]:
    return 0.1, 0.01


def step_change(m: int) -> tuple[float, float]:
    return (0.1, 0.01) if m <= 90 else (0.155, 0.01)  # step time 0.11 s -> 0.165 s (+50 %)


def gradual(m: int) -> tuple[float, float]:
    factor = 1 + 0.1 * (5 * ((m - 1) // 5)) / 60  # +10 %/h, in 5-minute stairs
    return 0.1 * factor, 0.01 * factor


def input_wait_growth(m: int) -> tuple[float, float]:
    wait = 0.01 if m <= 60 else min(0.07, 0.01 + 0.001 * (m - 60))  # 0.01 s -> 0.07 s over an hour
    return 0.1, wait


def noisy(m: int) -> tuple[float, float]:
    pattern = (1.05, 0.95, 1.0, 1.05, 0.97, 0.95, 1.03, 1.05, 0.95, 1.01)  # +-5 % per 10-minute block
    total = 0.11 * pattern[(m - 1) // 10 % len(pattern)]
    return total - 0.01, 0.01


def warm_up(m: int) -> tuple[float, float]:
    return (0.32, 0.01) if m <= 5 else (0.1, 0.01)  # 3x slower for 5 minutes


def restart_slower(m: int) -> tuple[float, float]:
    return 0.144, 0.01  # step time 0.11 s -> 0.154 s (+40 %)


def slow_end(m: int) -> tuple[float, float]:
    return (0.1, 0.01) if m <= 96 else (0.155, 0.01)  # the last 12 minutes 50 % slower


def main() -> None:
    out = [
        "# promtool test rules: TraceMLStepTimeDrift. GENERATED by make_drift_test.py (see its docstring).",
        "# Step time = input wait + traced step time per step; the baseline is the job's best sustained",
        "# pace (10th percentile of its 5-minute means over 24 h, across attempts). One test per shape.",
        "rule_files: [../recording.yml, ../alerts.yml]",
        "evaluation_interval: 1m",
        "group_eval_order: [traceml-recording, traceml-recording-rates, traceml-recording-means, "
        "traceml-recording-collectives, traceml-recording-communication, traceml-recording-drift, "
        "traceml-recording-dashboard, traceml-recording-time, traceml-recording-goodput, traceml-recording-mfu, "
        "traceml-recording-histogram, traceml-recording-goodput-window, traceml-recording-memory, "
        "traceml-recording-recurrence, traceml-alerts, traceml-pipeline-health]",
        "",
        "tests:",
    ]

    def test(comment: str, lines: list[str], cases: list[str]) -> None:
        out.extend([f"  # --- {comment}", "  - interval: 1m", "    input_series:", *lines,
                    "    alert_rule_test:", *cases])

    test("+50 % step change at 90 m: fires within 20 m and is still firing at 240 m",
         series("step", step_change, 240),
         quiet([60, 89]) + firing("step", {104: "150%", 110: "150%", 180: "150%", 240: "150%"}))
    test("+10 %/h gradual drift for 6 h: fires by the time the step is 30 % slower (180 m) and stays",
         series("gradual", gradual, 360),
         quiet([60, 145]) + firing("gradual", {150: "122%", 180: "126.2%", 240: "134.7%", 300: "143%",
                                               360: "151.1%"}))
    test("only input wait grows (0.01 s -> 0.07 s from 60 m to 120 m), traced time flat: fires",
         series("loader", input_wait_growth, 180),
         quiet([59, 90]) + firing("loader", {95: "130%", 120: "152.7%", 180: "154.5%"}))
    test("6 h steady with +-5 % noise in 10-minute blocks: quiet",
         series("noisy", noisy, 360), quiet(list(range(20, 361, 20))))
    test("3x slow warm-up in the first 5 m; then a restart under a new run id with its own warm-up: quiet",
         series("first", warm_up, 60, ended="0x59 1 stale", tail=" stale")
         + series("second", warm_up, 119, head="_x61 "),
         quiet([5, 10, 15, 20, 30, 60, 65, 70, 75, 80, 120, 180]))
    # Job identity (traceml_job): attempts of one job share the baseline. Attempt 'a' steps for an
    # hour and dies (its series go stale); 'b' restarts at 62 m under the same job.
    test("restart under the same job identity, 40 % slower: fires once the restart is 15 m old",
         series("a", steady, 60, ended="0x60 stale", tail=" stale", job="nightly")
         + series("b", restart_slower, 119, head="_x61 ", job="nightly"),
         quiet([30, 60, 70, 80]) + firing("b", {95: "140%", 120: "140%", 180: "140%"}, job="nightly"))
    test("restart under the same job identity with a 3x warm-up, then the old pace: quiet",
         series("a", steady, 60, ended="0x60 stale", tail=" stale", job="steady")
         + series("b", warm_up, 119, head="_x61 ", job="steady"),
         quiet([30, 60, 65, 70, 75, 80, 90, 120, 180]))
    # The end of a job: the last 12 minutes are 50 % slower (pending from about 98 m); at 108 m the
    # rank ends cleanly. 'otlp' keeps its flat series in the collector for 5 m (metric_expiration);
    # 'direct' is scraped once more with the end marker, then its series go stale.
    test("end of a job while the drift alert is pending (OTLP and direct paths): quiet",
         series("otlp", lambda m: slow_end(m) if m <= 108 else (0.0, 0.0), 113,
                ended="0x107 1x5 stale", tail=" stale")
         + series("direct", slow_end, 108, ended="0x107 1 stale", tail=" stale"),
         quiet([100, 106, 108, 110, 112, 115, 120, 130]))
    OUT.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
