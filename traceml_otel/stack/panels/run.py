"""The "Run" row: each attempt's step time against the job's baseline, throughput, live ranks."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import dashed, row, stat, target, timeseries
from traceml_otel.stack.queries import REC, RUN


def run_row(y: int) -> list[dict[str, Any]]:
    """Drift against the job's baseline, throughput, ranks live and the time since the last step."""
    return [row("Run", y), _drift(y + 1), *_run_stats(y + 1)]


def _drift(y: int) -> dict[str, Any]:
    attempts = 'run:traceml_step_time_seconds:mean{traceml_job="$job"}'
    baseline = 'job:traceml_step_time_seconds:baseline{traceml_job="$job"}'
    return timeseries(
        "Step time of each attempt against the job's baseline (drift)",
        "Step time per step (input wait + traced step, all ranks, 5 m means) of every attempt (run id) "
        "of the selected run's job, side by side, and the job's baseline: its best sustained pace "
        "(10th percentile of its own means, across attempts, so a restart is compared with the "
        "attempts before it). TraceMLStepTimeDrift fires above 1.2 x baseline for 10 m. Without a job "
        "identity (TRACEML_JOB, torchrun's rendezvous id, Slurm) each run is its own job. Needs the "
        "recording rules (prometheus/recording.yml).",
        (0, y, 12, 8),
        "s",
        [
            target("A", attempts, "attempt {{traceml_run_id}}"),
            target("B", baseline, "baseline"),
            target("C", f"1.2 * {baseline}", "alert threshold (1.2 x baseline)"),
        ],
        overrides=[
            dashed(
                "alert threshold (1.2 x baseline)",
                {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
            ),
            {
                "matcher": {"id": "byName", "options": "baseline"},
                "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}}],
            },
        ],
    )


def _run_stats(y: int) -> list[dict[str, Any]]:
    return [
        timeseries(
            "Throughput (all ranks)",
            "Samples per second over all ranks (rate of traceml_samples_total: the batch dimension "
            "the DataLoader returned, or trace_step(samples=)), and completed steps per second (rate of "
            "traceml_steps_total). A flat zero is a stall; samples/s is empty when no step recorded its "
            "work.",
            (12, y, 9, 8),
            "ops",
            [
                target("A", f"run:traceml_samples:rate{{{REC}}}", "samples/s"),
                target("B", f"run:traceml_steps:rate{{{REC}}}", "steps/s"),
            ],
            overrides=[{  # steps/s on its own axis: samples/s is batch size times larger
                "matcher": {"id": "byName", "options": "steps/s"},
                "properties": [{"id": "custom.axisPlacement", "value": "right"},
                               {"id": "custom.axisLabel", "value": "steps/s"}],
            }],
        ),
        stat(
            "Since the last step",
            "time() - newest traceml_step_last_timestamp_seconds of the run.",
            (21, y, 3, 8),
            "s",
            f"time() - max (traceml_step_last_timestamp_seconds{{{RUN}}})",
            threshold_steps=(("orange", 120), ("red", 300)),
        ),
    ]


def ranks_live(y: int, x: int = 18, w: int = 3) -> dict[str, Any]:
    """Ranks live as a share of the world size the ranks report, named "of N ranks"; red below all."""
    world = f"max (traceml_world_size{{{RUN}}})"
    panel = stat(
        "Ranks live (of the world size)",
        "Ranks reporting and not ended (traceml_run_ended == 0) over the world size the ranks report "
        "(traceml_world_size), named \"of N ranks\": 100 % is every rank; red below (a rank never "
        "scraped or stuck before init() pages as TraceMLRanksMissing after 5 m, one that vanished as "
        "TraceMLTelemetryMissing).",
        (x, y, w, 6),
        "percentunit",
        f"(count (traceml_run_ended{{{RUN}}} == 0) / {world})"
        f" * on () group_left (world) count_values without () (\"world\", {world})",
    )
    panel["targets"][0]["legendFormat"] = "of {{world}} ranks"
    panel["options"]["textMode"] = "value_and_name"
    panel["fieldConfig"]["defaults"]["thresholds"] = {
        "mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
    }
    return panel
