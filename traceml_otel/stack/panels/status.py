"""The first row, "Status": how the run ended (exit status), the hang culprit with its location,
and the ranks live of the world size: what an on-call opens the dashboard for."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import TEMPO, row, stat
from traceml_otel.stack.panels.run import ranks_live
from traceml_otel.stack.queries import RUN


def status_row(y: int) -> list[dict[str, Any]]:
    """Exit status, hang culprit (metrics, and its span's file:line in Tempo), ranks live of world."""
    return [row("Status", y), _exit_status(y + 1), _hang_culprit(y + 1), ranks_live(y + 1, x=8, w=4),
            _hang_location(y + 1)]


def _exit_status(y: int) -> dict[str, Any]:
    panel = stat(
        "Exit status",
        "How the run's ranks ended (traceml_run_exit, over the dashboard's range): clean, exception "
        "(with the exception type; SystemExit for a non-zero sys.exit), signal or interrupted "
        "(SIGTERM/SIGINT), and on how many ranks. Empty while the run is still running. A rank killed "
        "outright (SIGKILL, the OOM killer) sends no end: compare with Ranks live.",
        (0, y, 4, 6),
        "short",
        f"count by (traceml_exit_status, traceml_exit_reason) "
        f"(last_over_time(traceml_run_exit{{{RUN}}}[$__range]))",
        no_value="no end yet",
    )
    target = panel["targets"][0]
    target["legendFormat"] = "{{traceml_exit_status}} {{traceml_exit_reason}}"
    target["instant"] = True
    panel["options"]["textMode"] = "value_and_name"
    panel["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byRegexp", "options": "^(exception|signal).*"},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]},
        {"matcher": {"id": "byRegexp", "options": "^interrupted.*|.*SIG(TERM|INT)$"},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}}]},
    ]
    return panel


def _hang_culprit(y: int) -> dict[str, Any]:
    panel = stat(
        "Hang culprit",
        "The rank whose hang watchdog reports it stuck outside a collective "
        "(traceml_progress_stalled_seconds, phase not collective): the rank TraceMLTrainingStalled "
        "names, its phase (step, input, before first step, ...) and how long. The file:line is in its "
        "traceml.hang span (the panel beside) and rank-R.hang.json.",
        (4, y, 4, 6),
        "s",
        f'topk(1, max by (traceml_rank, traceml_phase_name) (traceml_progress_stalled_seconds{{{RUN},'
        f'traceml_phase_name!~"collective|none"}}))',
        threshold_steps=(("red", 1),),
        no_value="no hang",
    )
    panel["targets"][0]["legendFormat"] = "rank {{traceml_rank}} ({{traceml_phase_name}})"
    panel["options"]["textMode"] = "value_and_name"
    return panel


def _hang_location(y: int) -> dict[str, Any]:
    return {
        "type": "table",
        "title": "Hang culprit's location (Tempo)",
        "description": ("The traceml.hang spans of the culprit rank(s) of this run: "
                        "span.traceml.hang.culprit_location is the file:line, "
                        "span.traceml.hang.verdict the sentence over every rank."),
        "datasource": TEMPO,
        "gridPos": {"x": 12, "y": y, "w": 12, "h": 6},
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "targets": [
            {
                "refId": "A",
                "datasource": TEMPO,
                "queryType": "traceql",
                "limit": 5,
                "tableType": "spans",
                "query": ('{ name = "traceml.hang" && span.traceml.run.id = "$run_id" '
                          "&& span.traceml.hang.culprit = true } "
                          "| select(span.traceml.hang.culprit_location, span.traceml.hang.verdict)"),
            }
        ],
    }
