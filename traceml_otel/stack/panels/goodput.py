"""The "Where the job's time went" row: the run's time by category, goodput across ranks, the selected
ranks' time, the lowest-goodput ranks, and MFU (docs/goodput.md)."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import bars, row, stat, target, timeseries
from traceml_otel.stack.queries import RANKS, WINDOW, WORST_K, ranked, recorded

NO_TIME = "No time counters: an emitter older than traceml.time, or no step yet."
NO_MFU = ("No MFU: declare the FLOPs (trace_step(flops=), declare_flops(), or measure_flops=True) and, "
          "on CPU or a device not in the table, TRACEML_PEAK_FLOPS.")


def goodput_row(y: int) -> list[dict[str, Any]]:
    """Time by category and goodput (y+1), then the selected ranks, the lowest ranks and MFU (y+10)."""
    return [
        row("Where the job's time went", y),
        _time_by_category(y + 1),
        _goodput(y + 1),
        _selected_ranks_time(y + 10),
        _lowest_goodput(y + 10),
        *_mfu(y + 10),
    ]


def _time_by_category(y: int) -> dict[str, Any]:
    return timeseries(
        "The run's time by category (all ranks)",
        "Seconds of wall time per second, by category, summed over the run's ranks (recorded "
        "run:traceml_time_seconds:rate from traceml_time_seconds_total): stacked, the top is the number "
        "of ranks running. step.block is goodput; the rest is start-up, input wait, evaluation and "
        "checkpoints (outside.evaluation, outside.checkpoint, ...), time between steps, stalls, redone "
        "steps and shutdown. A block is counted when its category is known (an evaluation when it "
        "ends, start-up at the first step). Definitions: docs/goodput.md.",
        (0, y, 12, 9),
        "short",
        [target("A", recorded("run:traceml_time_seconds:rate"), "{{traceml_time_category}}")],
        stacked=True,
        no_value=NO_TIME,
    )


def _goodput(y: int) -> dict[str, Any]:
    ranks = recorded("run_rank:traceml_goodput:ratio")
    return timeseries(
        "Goodput: the run, across ranks, and the selected ranks",
        "Share of wall time inside the step blocks (step.block / all categories). The run's (all "
        "ranks), the lowest and median rank's (recorded run_rank:traceml_goodput:ratio), the ranks "
        "picked in the Rank variable, and the run's over the alert's longer window: alert "
        "TraceMLGoodputLow below 50 % while the run steps, once its start-up has left that window.",
        (12, y, 12, 9),
        "percentunit",
        [
            target("A", recorded("run:traceml_goodput:ratio"), "run (all ranks)"),
            target("B", f"min ({ranks})", "lowest rank"),
            target("C", f"quantile (0.5, {ranks})", "median rank"),
            target("D", recorded("run_rank:traceml_goodput:ratio", 'traceml_rank=~"$rank"'),
                   "rank {{traceml_rank}}"),
            target("E", recorded("run:traceml_goodput:long_ratio"), "run, alert window"),
        ],
        no_value=NO_TIME,
        maximum=1,
    )


def _selected_ranks_time(y: int) -> dict[str, Any]:
    return timeseries(
        "Time by category, the selected ranks",
        "Seconds per second by category of each rank picked in the Rank variable (one by default; "
        "rate of traceml_time_seconds_total): stacked, each rank's top is 1 while it runs.",
        (0, y, 8, 9),
        "short",
        [target("A", f"sum by (traceml_rank, traceml_time_category) "
                     f"(rate(traceml_time_seconds_total{{{RANKS}}}[{WINDOW}]))",
                "rank {{traceml_rank}} {{traceml_time_category}}")],
        stacked=True,
        no_value=NO_TIME,
    )


def _lowest_goodput(y: int) -> dict[str, Any]:
    return bars(
        f"{WORST_K} lowest-goodput ranks",
        f"The {WORST_K} ranks with the lowest mean goodput over the time range (bottomk of the recorded "
        "per-rank goodput): pick one in the Rank variable to see where its time went.",
        (8, y, 5, 9),
        "percentunit",
        [target("A", ranked("bottomk", recorded("run_rank:traceml_goodput:ratio")), "rank {{traceml_rank}}",
                instant=True)],
        maximum=1,
        no_value=NO_TIME,
    )


def _mfu(y: int) -> list[dict[str, Any]]:
    ranks = recorded("run_rank:traceml_mfu:ratio")
    return [
        timeseries(
            "MFU: the run and across ranks",
            "Model FLOPs utilisation: model FLOPs per second of step time over the peak FLOP/s "
            "(traceml_model_flops_total, traceml_peak_flops; recorded run_rank:traceml_mfu:ratio). The "
            "run's is its valid ranks' achieved FLOP/s over their peaks. A rank whose MFU would be "
            "above 100 % or not positive, or that has FLOPs but no known peak, is never drawn: it is "
            "counted beside this panel (a data problem; traceml analyze names its inputs).",
            (13, y, 8, 9),
            "percentunit",
            [
                target("A", recorded("run:traceml_mfu:ratio"), "run"),
                target("B", f"min ({ranks})", "lowest rank"),
                target("C", f"max ({ranks})", "highest rank"),
            ],
            no_value=NO_MFU,
            maximum=1,
        ),
        stat(
            "Ranks with an impossible MFU",
            "Ranks whose MFU is a data problem: above 100 %, not positive, or FLOPs with no known peak "
            "(recorded run:traceml_mfu_data_problems:count). Check flops= (per rank, per whole step) "
            "and TRACEML_PEAK_FLOPS; the analyzer's report names each rank's inputs.",
            (21, y, 3, 9),
            "short",
            recorded("run:traceml_mfu_data_problems:count"),
            threshold_steps=(("red", 1),),
            no_value="0",
        ),
    ]
