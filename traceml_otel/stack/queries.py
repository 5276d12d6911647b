"""PromQL the dashboard's panels share: the run's selectors, the recorded series, ranked and spread views.

``<sel>`` is the placeholder :func:`render.render_dashboard` fills with the configured selector; the
recorded series (``REC``) already carry it from the recording rules.
"""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import target

RUN = '<sel>traceml_run_id="$run_id"'
RANKS = f'{RUN}, traceml_rank=~"$rank"'
WINDOW = "$__rate_interval"
WORST_K = 5
REC = 'traceml_run_id="$run_id"'
"""Selector of the recorded series of the selected run (the recording rules already applied <sel>)."""
RUN_BUCKETS = f"run:traceml_step_duration_seconds_bucket:rate{{{REC}}}"
RANK_MEAN = f"run_rank:traceml_step_duration_seconds:mean{{{REC}}}"
RANK_WAIT = f"run_rank:traceml_input_wait_seconds:per_step{{{REC}}}"

# The info series of this run's ranks, with the label the other exporter uses.
GPU_OF_RANK = (
    "label_replace(max by (traceml_rank, traceml_gpu_uuid) (traceml_rank_info{"
    + RUN
    + ', traceml_rank=~"$rank", '
    'traceml_gpu_uuid!=""}), "UUID", "$1", "traceml_gpu_uuid", "(.+)")'
)
HOST_OF_RUN = (
    "label_replace(max by (traceml_host) (traceml_rank_info{"
    + RUN
    + '}), "nodename", "$1", "traceml_host", "(.+)")'
)


def recorded(series: str, extra: str = "") -> str:
    """A recorded series of the selected run (``extra``: more label matchers)."""
    return f"{series}{{{REC}{', ' + extra if extra else ''}}}"


def ranked(kind: str, series: str) -> str:
    """The ``WORST_K`` ranks by ``kind`` (topk / bottomk) of their mean over the dashboard's time range:
    one instant query (a bar each), reading each rank's series once; a range query would read the
    whole range again at every step, and a per-step topk draws every rank that was ever in it."""
    return f"{kind}({WORST_K}, avg_over_time({series}[$__range]))"


def spread(series: str, unit_legend: str) -> list[dict[str, Any]]:
    """min / median / p95 / max across the run's ranks of a per-rank recorded series: 4 lines at any
    world size (docs/observability-stack.md, "At 1,024 ranks")."""
    return [
        target("A", f"min ({series})", f"min {unit_legend}"),
        target("B", f"quantile (0.5, {series})", f"median {unit_legend}"),
        target("C", f"quantile (0.95, {series})", f"p95 {unit_legend}"),
        target("D", f"max ({series})", f"max {unit_legend}"),
    ]
