"""The "Telemetry pipeline" row: dropped spans, seconds since each rank's last step, the Tempo table."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import TEMPO, row, target, timeseries
from traceml_otel.stack.queries import REC, RUN, WINDOW, WORST_K


def pipeline_row(y: int) -> list[dict[str, Any]]:
    """Dropped spans and stalled ranks (y+1), then the run's step traces in Tempo (y+9)."""
    return [row("Telemetry pipeline", y), *_export_health(y + 1), _step_traces(y + 9)]


def _export_health(y: int) -> list[dict[str, Any]]:
    return [
        timeseries(
            "Spans dropped by OTLP export",
            "Spans the run's ranks could not deliver over the alert's window (exported from 0, live), and "
            f"the {WORST_K} ranks that dropped most; their steps are incomplete in Tempo but "
            "complete in the local copy. Alert TraceMLTelemetryDroppingSpans.",
            (0, y, 12, 8),
            "short",
            [
                target("A", f"run:traceml_export_dropped_spans:increase{{{REC}}}", "all ranks"),
                target(
                    "B",
                    f"topk({WORST_K}, sum by (traceml_rank) "
                    f"(increase(traceml_export_dropped_spans_total{{{RUN}}}[{WINDOW}])) > 0)",
                    "rank {{traceml_rank}}",
                ),
            ],
        ),
        timeseries(
            "Seconds since each rank's last step (worst 5)",
            "time() - traceml_step_last_timestamp_seconds. Alerts TraceMLTrainingStalled (all ranks) and "
            "TraceMLRankStalled (one rank) at 5 m.",
            (12, y, 12, 8),
            "s",
            [
                target(
                    "A",
                    f"topk({WORST_K}, time() - max by (traceml_rank) (traceml_step_last_timestamp_seconds"
                    f"{{{RUN}}}))",
                    "rank {{traceml_rank}}",
                )
            ],
            threshold_steps=(("orange", 120), ("red", 300)),
        ),
    ]


def _step_traces(y: int) -> dict[str, Any]:
    return {
        "type": "table",
        "title": "Step traces of this run (Tempo)",
        "description": (
            "traceml.step spans of the selected run; click a trace id to open the waterfall "
            "of that step across all ranks."
        ),
        "datasource": TEMPO,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 8},
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
