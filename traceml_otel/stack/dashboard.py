"""The "TraceML training" Grafana dashboard, built once here with ``<sel>`` placeholders.

Panels read the contract's Prometheus names (docs/telemetry.md), the recording rules'
series (drift baseline), and, joined through ``traceml_rank_info``, NVIDIA DCGM exporter
(``UUID`` label) and node-exporter (``node_uname_info``'s ``nodename``) series. Views stay
readable at 1,024 ranks: panels show the distribution across ranks (min / median / p95 / max,
slowest and fastest k) from recorded series, and per-rank lines only for the ranks picked in the
Rank variable (one by default).
"""

from __future__ import annotations

from typing import Any

PROM = {"type": "prometheus", "uid": "${datasource}"}
TEMPO = {"type": "tempo", "uid": "${tempo}"}
RUN = '<sel>traceml_run_id="$run_id"'
RANKS = f'{RUN}, traceml_rank=~"$rank"'
WINDOW = "$__rate_interval"
WORST_K = 5
REC = 'traceml_run_id="$run_id"'
RUN_BUCKETS = f"run:traceml_step_duration_seconds_bucket:rate{{{REC}}}"
RANK_MEAN = f"run_rank:traceml_step_duration_seconds:mean{{{REC}}}"
RANK_WAIT = f"run_rank:traceml_input_wait_seconds:per_step{{{REC}}}"
"""Selector of the recorded series of the selected run (the recording rules already applied <sel>)."""


def _ranked(kind: str, series: str) -> str:
    """The ``WORST_K`` ranks by ``kind`` (topk / bottomk) of their mean over the dashboard's time range:
    one instant query (a bar each), reading each rank's series once; a range query would read the
    whole range again at every step, and a per-step topk draws every rank that was ever in it."""
    return f"{kind}({WORST_K}, avg_over_time({series}[$__range]))"


def _spread(series: str, unit_legend: str) -> list[dict[str, Any]]:
    """min / median / p95 / max across the run's ranks of a per-rank recorded series: 4 lines at any
    world size (docs/observability-stack.md, "At 1,024 ranks")."""
    return [
        _target("A", f"min ({series})", f"min {unit_legend}"),
        _target("B", f"quantile (0.5, {series})", f"median {unit_legend}"),
        _target("C", f"quantile (0.95, {series})", f"p95 {unit_legend}"),
        _target("D", f"max ({series})", f"max {unit_legend}"),
    ]

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

DCGM_NOTE = (
    "No data: this Prometheus has no NVIDIA DCGM exporter series for the GPUs of this run "
    "(a CPU run, CUDA not yet initialised, or no DCGM exporter scraped)."
)
NODE_NOTE = "No data: no node-exporter series (node_uname_info) for the hosts of this run."


def _target(
    ref: str, expr: str, legend: str, exemplar: bool = False, instant: bool = False
) -> dict[str, Any]:
    target = {
        "refId": ref,
        "datasource": PROM,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
    }
    if exemplar:
        target["exemplar"] = True
    return target


def _thresholds(*steps: tuple[str, float]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, *({"color": c, "value": v} for c, v in steps)],
    }


def _timeseries(
    title: str,
    description: str,
    grid: tuple[int, int, int, int],
    unit: str,
    targets: list[dict[str, Any]],
    *,
    stacked: bool = False,
    thresholds: tuple = (),
    no_value: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if stacked else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line" if thresholds else "off"},
        },
        "thresholds": _thresholds(*thresholds),
    }
    if no_value:
        defaults["noValue"] = no_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "right",
                "showLegend": True,
                "calcs": ["mean", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def _bars(
    title: str, description: str, grid: tuple[int, int, int, int], unit: str, targets: list[dict[str, Any]]
) -> dict[str, Any]:
    """A bar gauge of instant queries (one bar per series): the ranked-ranks panels."""
    x, y, w, h = grid
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {
            "orientation": "horizontal",
            "displayMode": "basic",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
        },
        "targets": targets,
    }


def _stat(
    title: str,
    description: str,
    grid: tuple[int, int, int, int],
    unit: str,
    expr: str,
    thresholds: tuple = (),
) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": _thresholds(*thresholds)}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        },
        "targets": [_target("A", expr, "")],
    }


def _row(title: str, y: int) -> dict[str, Any]:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def _dcgm(title: str, metric: str, unit: str, grid: tuple[int, int, int, int]) -> dict[str, Any]:
    expr = f"max by (UUID) ({metric}) * on (UUID) group_left (traceml_rank) {GPU_OF_RANK}"
    return _timeseries(
        title,
        f"{metric} from the NVIDIA DCGM exporter, joined to ranks through traceml_rank_info's "
        f"traceml_gpu_uuid (= DCGM's UUID label). {DCGM_NOTE}",
        grid,
        unit,
        [_target("A", expr, "rank {{traceml_rank}}")],
        no_value=DCGM_NOTE,
    )


def _communication_panels(y: int) -> list[dict[str, Any]]:
    """The "Communication" row: exposed share per rank (the alert's series) and collective time by kind."""
    shares = 'run_rank:traceml_communication_share:ratio{traceml_run_id="$run_id"}'
    share = 'run_rank:traceml_communication_share:ratio{traceml_run_id="$run_id", traceml_rank=~"$rank"}'
    least = 'run:traceml_communication_share:min{traceml_run_id="$run_id"}'

    def per_step(recorded: str) -> str:
        return f"{recorded}{{{REC}}}"

    return [
        _row("Communication", y),
        _timeseries(
            "Exposed communication share across ranks, and the selected ranks",
            "Exposed collective time (the part of the collectives the step waited for, not overlapped "
            "with compute) / step time (input wait + traced step), per rank, and the rank that waits "
            "least. Alert TraceMLCommunicationBound: the least-waiting rank >= 10 % (warning), >= 20 % "
            "(critical). A rank far above the others waits for a straggler (TraceMLSyncStraggler). Empty "
            "without collective timing (one process, collectives=False) or where the exposed part is not "
            "measured (async_op calls, CUDA side streams). Needs the recording rules.",
            (0, y + 1, 12, 8),
            "percentunit",
            [
                _target("A", share, "rank {{traceml_rank}}"),
                _target("B", least, "least-waiting rank (alert)"),
                _target("C", f"quantile (0.5, {shares})", "median rank"),
                _target("D", f"max ({shares})", "max rank"),
            ],
            thresholds=(("orange", 0.1), ("red", 0.2)),
            no_value="No exposed collective time: no collectives timed, or their exposed part not measured.",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "least-waiting rank (alert)"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "custom.lineWidth", "value": 2},
                    ],
                }
            ],
        ),
        _timeseries(
            "Collective time per step by kind (all ranks)",
            "Total collective time per step (calls' durations, overlap with compute included) and its "
            "exposed part, per source (ddp: gradient buckets, api: torch.distributed calls) and kind, "
            "from traceml_collective_duration_seconds and traceml_collective_exposed_seconds. Total minus "
            "exposed is what compute hid.",
            (12, y + 1, 12, 8),
            "s",
            [
                _target(
                    "A",
                    per_step("run:traceml_collective_seconds:per_step"),
                    "{{traceml_collective_source}} {{traceml_collective_kind}} total",
                ),
                _target(
                    "B",
                    per_step("run:traceml_collective_exposed_seconds:per_step"),
                    "{{traceml_collective_source}} {{traceml_collective_kind}} exposed",
                ),
            ],
            no_value="No collectives timed in this run.",
        ),
    ]


def _panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = [_row("Run", 0)]
    attempts = 'run:traceml_step_time_seconds:mean{traceml_job="$job"}'
    baseline = 'job:traceml_step_time_seconds:baseline{traceml_job="$job"}'
    panels.append(
        _timeseries(
            "Step time of each attempt against the job's baseline (drift)",
            "Step time per step (input wait + traced step, all ranks, 5 m means) of every attempt (run id) "
            "of the selected run's job, side by side, and the job's baseline: its best sustained pace "
            "(10th percentile of its own means, across attempts, so a restart is compared with the "
            "attempts before it). TraceMLStepTimeDrift fires above 1.2 x baseline for 10 m. Without a job "
            "identity (TRACEML_JOB, torchrun's rendezvous id, Slurm) each run is its own job. Needs the "
            "recording rules (prometheus/recording.yml).",
            (0, 1, 12, 8),
            "s",
            [
                _target("A", attempts, "attempt {{traceml_run_id}}"),
                _target("B", baseline, "baseline"),
                _target("C", f"1.2 * {baseline}", "alert threshold (1.2 x baseline)"),
            ],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "alert threshold (1.2 x baseline)"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                    ],
                },
                {
                    "matcher": {"id": "byName", "options": "baseline"},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}}],
                },
            ],
        )
    )
    panels.append(
        _timeseries(
            "Throughput (all ranks)",
            "Samples per second over all ranks (rate of traceml_samples_total: the batch dimension "
            "the DataLoader returned, or trace_step(samples=)), and completed steps per second (rate of "
            "traceml_steps_total). A flat zero is a stall; samples/s is empty when no step recorded its "
            "work.",
            (12, 1, 6, 8),
            "ops",
            [
                _target("A", f"run:traceml_samples:rate{{{REC}}}", "samples/s"),
                _target("B", f"run:traceml_steps:rate{{{REC}}}", "steps/s"),
            ],
        )
    )
    panels.append(
        _stat(
            "Ranks live",
            "Ranks reporting and not ended (traceml_run_ended == 0). A rank that vanished without a clean "
            "end "
            "fires TraceMLTelemetryMissing.",
            (18, 1, 3, 8),
            "short",
            f"count (traceml_run_ended{{{RUN}}} == 0)",
        )
    )
    panels.append(
        _stat(
            "Since the last step",
            "time() - newest traceml_step_last_timestamp_seconds of the run.",
            (21, 1, 3, 8),
            "s",
            f"time() - max (traceml_step_last_timestamp_seconds{{{RUN}}})",
            thresholds=(("orange", 120), ("red", 300)),
        )
    )

    panels.append(_row("Step time and ranks", 9))
    panels.append(
        _timeseries(
            "Traced step time p50 / p95: all ranks, and the selected ranks",
            "histogram_quantile over the traceml.step.duration buckets of every step of every rank (the "
            "recorded run:traceml_step_duration_seconds_bucket:rate), and of the ranks picked in the Rank "
            "variable (drill in; exemplar dots link a bucket to the trace of one step: hover a dot, then "
            "'Open step trace').",
            (0, 10, 12, 9),
            "s",
            [
                _target("A", f"histogram_quantile(0.5, {RUN_BUCKETS})", "p50 all ranks"),
                _target("B", f"histogram_quantile(0.95, {RUN_BUCKETS})", "p95 all ranks"),
                _target(
                    "C",
                    "histogram_quantile(0.95, sum by (traceml_rank, le) "
                    "(rate(traceml_step_duration_seconds_bucket"
                    f"{{{RANKS}}}[{WINDOW}])))",
                    "p95 rank {{traceml_rank}}",
                    exemplar=True,
                ),
            ],
        )
    )
    panels.append(
        _bars(
            f"Slowest and fastest {WORST_K} ranks by mean traced step time",
            f"The {WORST_K} slowest (topk) and {WORST_K} fastest (bottomk) ranks by their mean traced step "
            "time over the time range, from the recorded per-rank means: a straggler is a bar far above "
            "the others. Pick a rank in the Rank variable to drill into it.",
            (12, 10, 12, 9),
            "s",
            [
                _target("A", _ranked("topk", RANK_MEAN), "slow rank {{traceml_rank}}", instant=True),
                _target("B", _ranked("bottomk", RANK_MEAN), "fast rank {{traceml_rank}}", instant=True),
            ],
        )
    )
    panels.append(
        _timeseries(
            "Mean traced step time across ranks (min / median / p95 / max)",
            "The distribution over every rank of the run of each rank's mean traced step time (recorded "
            "run_rank:traceml_step_duration_seconds:mean): 4 lines at any world size. A max far above p95 "
            "is one slow rank (see the slowest ranks); p95 far above the median, a slow group.",
            (0, 19, 12, 9),
            "s",
            _spread(RANK_MEAN, "rank"),
        )
    )
    panels.append(
        _timeseries(
            "Input wait per step across ranks (min / median / p95 / max)",
            "The distribution over every rank of each rank's input wait per step (recorded "
            "run_rank:traceml_input_wait_seconds:per_step, from traceml_step_input_wait_seconds).",
            (12, 19, 12, 9),
            "s",
            _spread(RANK_WAIT, "rank"),
        )
    )
    phase = f"run:traceml_phase_seconds:per_step{{{REC}}}"
    wait = f"run:traceml_input_wait_seconds:per_step{{{REC}}}"
    residual = (
        f"clamp_min(run:traceml_traced_step_seconds:per_step{{{REC}}} "
        f"- sum without (traceml_phase_name) ({phase}), 0)"
    )
    panels.append(
        _timeseries(
            "Time per step by phase (mean over ranks)",
            "Phase time per step, input wait before the step, and the rest of the traced block that no phase "
            "covers "
            "(residual: zero_grad, Python, collectives outside backward). Stacked, so the top is step time.",
            (0, 28, 12, 9),
            "s",
            [
                _target("A", phase, "{{traceml_phase_name}}"),
                _target("B", wait, "input wait"),
                _target("C", residual, "residual"),
            ],
            stacked=True,
        )
    )
    panels.append(
        _timeseries(
            "Input-wait share across ranks, and the selected ranks",
            "input wait / (input wait + traced step time) per rank, exact from the input-wait sums. Alert "
            "TraceMLInputBound: the median over ranks (the line drawn bold) >= 10 % (warning), >= 20 % "
            "(critical). Recorded run_rank:traceml_input_wait_share:ratio; the selected ranks (Rank "
            "variable) are drawn too.",
            (12, 28, 12, 9),
            "percentunit",
            [
                _target("A", f"run:traceml_input_wait_share:median{{{REC}}}", "median rank (alert)"),
                _target("B", f"max (run_rank:traceml_input_wait_share:ratio{{{REC}}})", "max rank"),
                _target("C", f"min (run_rank:traceml_input_wait_share:ratio{{{REC}}})", "min rank"),
                _target("D", f'run_rank:traceml_input_wait_share:ratio{{{REC}, traceml_rank=~"$rank"}}',
                        "rank {{traceml_rank}}"),
            ],
            thresholds=(("orange", 0.1), ("red", 0.2)),
        )
    )
    panels.append(
        _timeseries(
            "Rank skew of traced step time",
            "(slowest rank mean - median rank mean) / median. Alert TraceMLStragglerRank at >= 20 %. "
            "Synchronous "
            "collectives (DDP) equalise step time; see the backward panel for stragglers they hide.",
            (0, 37, 12, 8),
            "percentunit",
            [_target("A", f"max (run_rank:traceml_step_duration_seconds:skew{{{REC}}})", "skew")],
            thresholds=(("orange", 0.2), ("red", 0.5)),
        )
    )
    backward = f"run_rank:traceml_backward_seconds_per_step:mean{{{REC}}}"
    panels.append(
        _bars(
            f"Backward time per step, {WORST_K} lowest ranks",
            "Under DDP the rank that reaches the gradient all-reduce last waits least, so the straggler has "
            f"the LOWEST bar (bottomk {WORST_K} of the mean over the time range). Alert "
            "TraceMLSyncStraggler.",
            (12, 37, 12, 8),
            "s",
            [_target("A", _ranked("bottomk", backward), "rank {{traceml_rank}}", instant=True)],
        )
    )

    panels += _communication_panels(45)

    panels.append(_row("Memory, GPU and host", 54))
    panels.append(
        _timeseries(
            "CUDA peak memory across ranks, and the selected ranks",
            "torch.cuda max_memory_reserved / max_memory_allocated, the maximum over each export interval. "
            "Alert "
            "TraceMLCudaMemoryCreep: reserved rising >= 1 GiB per hour. Empty on CPU runs.",
            (0, 55, 12, 8),
            "bytes",
            [
                _target("A", f"max (traceml_cuda_memory_peak_reserved_bytes{{{RUN}}})", "reserved, max rank"),
                _target("B", f"quantile (0.5, traceml_cuda_memory_peak_reserved_bytes{{{RUN}}})",
                        "reserved, median rank"),
                _target("C", f"max (traceml_cuda_memory_peak_allocated_bytes{{{RUN}}})",
                        "allocated, max rank"),
                _target(
                    "D",
                    f"max by (traceml_rank) (traceml_cuda_memory_peak_reserved_bytes{{{RANKS}}})",
                    "reserved rank {{traceml_rank}}",
                ),
            ],
            no_value="No CUDA memory: a CPU run, or CUDA not initialised yet.",
        )
    )
    panels.append(_dcgm("GPU utilization (DCGM)", "DCGM_FI_DEV_GPU_UTIL", "percent", (12, 55, 12, 8)))
    panels.append(
        _dcgm(
            "GPU memory bandwidth utilization (DCGM)", "DCGM_FI_DEV_MEM_COPY_UTIL", "percent", (0, 63, 12, 8)
        )
    )
    panels.append(_dcgm("GPU power (DCGM)", "DCGM_FI_DEV_POWER_USAGE", "watt", (12, 63, 12, 8)))
    cpu = (
        f'max by (nodename) ((1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"}}[{WINDOW}]))) '
        f"* on (instance) group_left (nodename) node_uname_info) * on (nodename) group_left () {HOST_OF_RUN}"
    )
    panels.append(
        _timeseries(
            "Host CPU busy (node-exporter)",
            "1 - idle share of all CPUs of each host of the run (busiest, median, least busy), from "
            "node-exporter, joined through "
            f"node_uname_info's nodename = traceml_rank_info's traceml_host. {NODE_NOTE}",
            (0, 71, 12, 8),
            "percentunit",
            [
                _target("A", f"max ({cpu})", "busiest host"),
                _target("B", f"quantile (0.5, {cpu})", "median host"),
                _target("C", f"min ({cpu})", "least busy host"),
            ],
            no_value=NODE_NOTE,
        )
    )

    panels.append(_row("Telemetry pipeline", 79))
    panels.append(
        _timeseries(
            "Spans dropped by OTLP export",
            "Spans the run's ranks could not deliver over the alert's window (exported from 0, live), and "
            f"the {WORST_K} ranks that dropped most; their steps are incomplete in Tempo but "
            "complete in the local copy. Alert TraceMLTelemetryDroppingSpans.",
            (0, 80, 12, 8),
            "short",
            [
                _target("A", f"run:traceml_export_dropped_spans:increase{{{REC}}}", "all ranks"),
                _target(
                    "B",
                    f"topk({WORST_K}, sum by (traceml_rank) "
                    f"(increase(traceml_export_dropped_spans_total{{{RUN}}}[{WINDOW}])) > 0)",
                    "rank {{traceml_rank}}",
                ),
            ],
        )
    )
    panels.append(
        _timeseries(
            "Seconds since each rank's last step (worst 5)",
            "time() - traceml_step_last_timestamp_seconds. Alerts TraceMLTrainingStalled (all ranks) and "
            "TraceMLRankStalled (one rank) at 5 m.",
            (12, 80, 12, 8),
            "s",
            [
                _target(
                    "A",
                    f"topk({WORST_K}, time() - max by (traceml_rank) (traceml_step_last_timestamp_seconds"
                    f"{{{RUN}}}))",
                    "rank {{traceml_rank}}",
                )
            ],
            thresholds=(("orange", 120), ("red", 300)),
        )
    )
    panels.append(
        {
            "type": "table",
            "title": "Step traces of this run (Tempo)",
            "description": (
                "traceml.step spans of the selected run; click a trace id to open the waterfall "
                "of that step across all ranks."
            ),
            "datasource": TEMPO,
            "gridPos": {"x": 0, "y": 88, "w": 24, "h": 8},
            "fieldConfig": {"defaults": {}, "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm"},
            "targets": [
                {
                    "refId": "A",
                    "datasource": TEMPO,
                    "queryType": "traceql",
                    "limit": 20,
                    "tableType": "traces",
                    "query": '{ name = "traceml.step" && span.traceml.run.id = "$run_id" }',
                }
            ],
        }
    )
    for number, panel in enumerate(panels, start=1):
        panel["id"] = number
    return panels


def _variable_query(name: str, label: str, query: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROM,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "hide": 0,
        "options": [],
        "current": {},
        "skipUrlSync": False,
        **extra,
    }


def _datasource_variable(name: str, label: str, kind: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "datasource",
        "query": kind,
        "regex": "",
        "current": {"text": label, "value": kind},
        "hide": 0,
        "refresh": 1,
        "options": [],
        "includeAll": False,
        "multi": False,
        "skipUrlSync": False,
    }


def build_dashboard() -> dict[str, Any]:
    """The dashboard with placeholders (``<sel>``); :func:`render.render_dashboard` fills them."""
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "datasource": PROM,
                    "enable": True,
                    "hide": False,
                    "iconColor": "red",
                    "name": "TraceML alerts",
                    "expr": 'ALERTS{alertstate="firing", traceml_run_id="$run_id"}',
                    "step": "30s",
                    "titleFormat": "{{alertname}}",
                    "textFormat": "{{severity}} {{traceml_rank}}",
                    "tagKeys": "severity,traceml_rank",
                    "useValueForTime": False,
                },
            ]
        },
        "description": (
            "traceml-otel: step time against the run's baseline, phases, input wait, ranks, "
            "communication, CUDA memory, GPU and host (DCGM, node-exporter) and export health of one "
            "training run. Metric names: docs/telemetry.md. Rendered by `traceml stack render`."
        ),
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": _panels(),
        "refresh": "30s",
        "schemaVersion": 42,
        "tags": ["traceml", "training", "opentelemetry"],
        "templating": {
            "list": [
                _datasource_variable("datasource", "Prometheus", "prometheus"),
                _datasource_variable("tempo", "Tempo", "tempo"),
                _variable_query(
                    "run_id",
                    "Run",
                    "label_values(traceml_steps_total{<sel>}, traceml_run_id)",
                    sort=2,
                    includeAll=False,
                    multi=False,
                ),
                _variable_query(
                    "job",
                    "Job",
                    f"label_values(traceml_steps_total{{{RUN}}}, traceml_job)",
                    sort=1,
                    includeAll=False,
                    multi=False,
                ),
                _variable_query(
                    "rank",
                    "Rank",
                    f"label_values(traceml_steps_total{{{RUN}}}, traceml_rank)",
                    sort=3,
                    includeAll=False,
                    multi=True,
                ),
            ]
        },
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "TraceML training",
        "uid": "traceml-training",
        "version": 1,
        "weekStart": "",
    }
