"""The "TraceML training" Grafana dashboard, built once here with ``<sel>`` placeholders: its rows
in order, its variables and its frame.

Panels read the contract's Prometheus names (docs/telemetry.md), the recording rules'
series (drift baseline), and, joined through ``traceml_rank_info``, NVIDIA DCGM exporter
(``UUID`` label) and node-exporter (``node_uname_info``'s ``nodename``) series. Views stay
readable at 1,024 ranks: panels show the distribution across ranks (min / median / p95 / max,
slowest and fastest k) from recorded series, and per-rank lines only for the ranks picked in the
Rank variable (one by default). Each row is built in ``stack/panels/``, the Grafana JSON in
``stack/grafana.py`` and the shared PromQL in ``stack/queries.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from traceml_otel.stack.grafana import PROM
from traceml_otel.stack.panels.communication import communication_row
from traceml_otel.stack.panels.goodput import goodput_row
from traceml_otel.stack.panels.hardware import hardware_row
from traceml_otel.stack.panels.pipeline import pipeline_row
from traceml_otel.stack.panels.run import run_row
from traceml_otel.stack.panels.status import status_row
from traceml_otel.stack.panels.steps import step_row
from traceml_otel.stack.queries import RUN

ROWS: tuple[Callable[[int], list[dict[str, Any]]], ...] = (
    status_row,
    run_row,
    goodput_row,
    step_row,
    communication_row,
    hardware_row,
    pipeline_row,
)
"""The rows from top to bottom; each starts where the one above it ends."""


def _panels() -> list[dict[str, Any]]:
    """Every row's panels stacked top to bottom, numbered 1.. in that order."""
    panels: list[dict[str, Any]] = []
    y = 0
    for build_row in ROWS:
        built = build_row(y)
        y = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in built)
        panels += built
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


def _annotations() -> dict[str, Any]:
    """Grafana's built-in annotations and the run's firing alerts."""
    return {
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
    }


def _variables() -> dict[str, Any]:
    """The datasource, run, job and rank variables."""
    return {
        "list": [
            _datasource_variable("datasource", "Prometheus", "prometheus"),
            _datasource_variable("tempo", "Tempo", "tempo"),
            _variable_query(  # newest first: by the last step's time over the dashboard's range
                "run_id",
                "Run",
                "query_result(sort_desc(topk(200, max by (traceml_run_id) "
                "(max_over_time(traceml_step_last_timestamp_seconds{<sel>}[$__range])))))",
                regex='/traceml_run_id="([^"]+)"/',
                sort=0,
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
    }


def build_dashboard() -> dict[str, Any]:
    """The dashboard with placeholders (``<sel>``); :func:`render.render_dashboard` fills them."""
    return {
        "annotations": _annotations(),
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
        "templating": _variables(),
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "TraceML training",
        "uid": "traceml-training",
        "version": 1,
        "weekStart": "",
    }
