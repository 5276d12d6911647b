"""The "Step time and ranks" row: step-time quantiles, ranked ranks, spreads, phases, input wait, skew."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import bars, row, target, timeseries
from traceml_otel.stack.queries import (
    RANK_MEAN,
    RANK_WAIT,
    RANKS,
    REC,
    RUN_BUCKETS,
    WINDOW,
    WORST_K,
    ranked,
    spread,
)


def step_row(y: int) -> list[dict[str, Any]]:
    """Step time across ranks (y+1), per-rank spreads (y+10), phases and input wait (y+19), skew (y+28)."""
    return [
        row("Step time and ranks", y),
        *_step_time(y + 1),
        *_spreads(y + 10),
        _phases(y + 19),
        _input_wait_share(y + 19),
        *_skew(y + 28),
    ]


def _step_time(y: int) -> list[dict[str, Any]]:
    return [
        timeseries(
            "Traced step time p50 / p95: all ranks, and the selected ranks",
            "histogram_quantile over the traceml.step.duration buckets of every step of every rank (the "
            "recorded run:traceml_step_duration_seconds_bucket:rate), and of the ranks picked in the Rank "
            "variable (drill in; exemplar dots link a bucket to the trace of one step: hover a dot, then "
            "'Open step trace').",
            (0, y, 12, 9),
            "s",
            [
                target("A", f"histogram_quantile(0.5, {RUN_BUCKETS})", "p50 all ranks"),
                target("B", f"histogram_quantile(0.95, {RUN_BUCKETS})", "p95 all ranks"),
                target(
                    "C",
                    "histogram_quantile(0.95, sum by (traceml_rank, le) "
                    "(rate(traceml_step_duration_seconds_bucket"
                    f"{{{RANKS}}}[{WINDOW}])))",
                    "p95 rank {{traceml_rank}}",
                    exemplar=True,
                ),
            ],
        ),
        bars(
            f"Slowest and fastest {WORST_K} ranks by mean traced step time",
            f"The {WORST_K} slowest (topk) and {WORST_K} fastest (bottomk) ranks by their mean traced step "
            "time over the time range, from the recorded per-rank means: a straggler is a bar far above "
            "the others. Pick a rank in the Rank variable to drill into it.",
            (12, y, 12, 9),
            "s",
            [
                target("A", ranked("topk", RANK_MEAN), "slow rank {{traceml_rank}}", instant=True),
                target("B", ranked("bottomk", RANK_MEAN), "fast rank {{traceml_rank}}", instant=True),
            ],
        ),
    ]


def _spreads(y: int) -> list[dict[str, Any]]:
    return [
        timeseries(
            "Mean traced step time across ranks (min / median / p95 / max)",
            "The distribution over every rank of the run of each rank's mean traced step time (recorded "
            "run_rank:traceml_step_duration_seconds:mean): 4 lines at any world size. A max far above p95 "
            "is one slow rank (see the slowest ranks); p95 far above the median, a slow group.",
            (0, y, 12, 9),
            "s",
            spread(RANK_MEAN, "rank"),
        ),
        timeseries(
            "Input wait per step across ranks (min / median / p95 / max)",
            "The distribution over every rank of each rank's input wait per step (recorded "
            "run_rank:traceml_input_wait_seconds:per_step, from traceml_step_input_wait_seconds).",
            (12, y, 12, 9),
            "s",
            spread(RANK_WAIT, "rank"),
        ),
    ]


def _phases(y: int) -> dict[str, Any]:
    phase = f"run:traceml_phase_seconds:per_step{{{REC}}}"
    wait = f"run:traceml_input_wait_seconds:per_step{{{REC}}}"
    residual = (
        f"clamp_min(run:traceml_traced_step_seconds:per_step{{{REC}}} "
        f"- sum without (traceml_phase_name) ({phase}), 0)"
    )
    return timeseries(
        "Time per step by phase (mean over ranks)",
        "Phase time per step, input wait before the step, and the rest of the traced block that no phase "
        "covers "
        "(residual: zero_grad, Python, collectives outside backward). Stacked, so the top is step time.",
        (0, y, 12, 9),
        "s",
        [
            target("A", phase, "{{traceml_phase_name}}"),
            target("B", wait, "input wait"),
            target("C", residual, "residual"),
        ],
        stacked=True,
    )


def _input_wait_share(y: int) -> dict[str, Any]:
    return timeseries(
        "Input-wait share across ranks, and the selected ranks",
        "input wait / (input wait + traced step time) per rank, exact from the input-wait sums. Alert "
        "TraceMLInputBound: the median over ranks (the line drawn bold) >= 10 % (warning), >= 20 % "
        "(critical). Recorded run_rank:traceml_input_wait_share:ratio; the selected ranks (Rank "
        "variable) are drawn too.",
        (12, y, 12, 9),
        "percentunit",
        [
            target("A", f"run:traceml_input_wait_share:median{{{REC}}}", "median rank (alert)"),
            target("B", f"max (run_rank:traceml_input_wait_share:ratio{{{REC}}})", "max rank"),
            target("C", f"min (run_rank:traceml_input_wait_share:ratio{{{REC}}})", "min rank"),
            target(
                "D",
                f'run_rank:traceml_input_wait_share:ratio{{{REC}, traceml_rank=~"$rank"}}',
                "rank {{traceml_rank}}",
            ),
        ],
        threshold_steps=(("orange", 0.1), ("red", 0.2)),
    )


def _skew(y: int) -> list[dict[str, Any]]:
    backward = f"run_rank:traceml_backward_seconds_per_step:mean{{{REC}}}"
    return [
        timeseries(
            "Rank skew of traced step time",
            "(slowest rank mean - median rank mean) / median. Alert TraceMLStragglerRank at >= 20 %. "
            "Synchronous "
            "collectives (DDP) equalise step time; see the backward panel for stragglers they hide.",
            (0, y, 12, 8),
            "percentunit",
            [target("A", f"max (run_rank:traceml_step_duration_seconds:skew{{{REC}}})", "skew")],
            threshold_steps=(("orange", 0.2), ("red", 0.5)),
        ),
        bars(
            f"Backward time per step, {WORST_K} lowest ranks",
            "Under DDP the rank that reaches the gradient all-reduce last waits least, so the straggler has "
            f"the LOWEST bar (bottomk {WORST_K} of the mean over the time range). Alert "
            "TraceMLSyncStraggler.",
            (12, y, 12, 8),
            "s",
            [target("A", ranked("bottomk", backward), "rank {{traceml_rank}}", instant=True)],
        ),
    ]
