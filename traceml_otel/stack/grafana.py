"""Grafana panel JSON builders (time series, bar gauge, stat, row, target) shared by the dashboard's rows.

They know Grafana's schema and nothing about traceml's metrics; the rows (``stack/panels/``) pass the
PromQL in (``stack/queries.py``).
"""

from __future__ import annotations

from typing import Any

PROM = {"type": "prometheus", "uid": "${datasource}"}
TEMPO = {"type": "tempo", "uid": "${tempo}"}
Grid = tuple[int, int, int, int]
"""(x, y, width, height) on Grafana's 24-column grid."""


def target(ref: str, expr: str, legend: str, exemplar: bool = False, instant: bool = False) -> dict[str, Any]:
    """One Prometheus query of a panel (a range query unless ``instant``)."""
    query = {
        "refId": ref,
        "datasource": PROM,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
    }
    if exemplar:
        query["exemplar"] = True
    return query


def thresholds(*steps: tuple[str, float]) -> dict[str, Any]:
    """Absolute thresholds: green below the first step, then each (colour, value)."""
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, *({"color": c, "value": v} for c, v in steps)],
    }


def _panel(kind: str, title: str, description: str, grid: Grid, defaults: dict[str, Any],
           overrides: list[dict[str, Any]], options: dict[str, Any],
           targets: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every panel has, in Grafana's order."""
    x, y, w, h = grid
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": options,
        "targets": targets,
    }


def _limits(defaults: dict[str, Any], maximum: float | None, no_value: str | None) -> dict[str, Any]:
    if maximum is not None:
        defaults["max"] = maximum
    if no_value:
        defaults["noValue"] = no_value
    return defaults


def timeseries(
    title: str,
    description: str,
    grid: Grid,
    unit: str,
    targets: list[dict[str, Any]],
    *,
    stacked: bool = False,
    threshold_steps: tuple = (),
    no_value: str | None = None,
    overrides: list[dict[str, Any]] | None = None,
    maximum: float | None = None,
) -> dict[str, Any]:
    """A time series panel with a table legend (mean, max); ``stacked`` stacks the series."""
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
            "thresholdsStyle": {"mode": "line" if threshold_steps else "off"},
        },
        "thresholds": thresholds(*threshold_steps),
    }
    options = {
        "legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                   "calcs": ["mean", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return _panel("timeseries", title, description, grid, _limits(defaults, maximum, no_value),
                  overrides or [], options, targets)


def bars(
    title: str,
    description: str,
    grid: Grid,
    unit: str,
    targets: list[dict[str, Any]],
    *,
    maximum: float | None = None,
    no_value: str | None = None,
) -> dict[str, Any]:
    """A bar gauge of instant queries (one bar per series): the ranked-ranks panels."""
    options = {
        "orientation": "horizontal",
        "displayMode": "basic",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showUnfilled": True,
    }
    return _panel("bargauge", title, description, grid, _limits({"unit": unit, "min": 0}, maximum, no_value),
                  [], options, targets)


def stat(
    title: str,
    description: str,
    grid: Grid,
    unit: str,
    expr: str,
    threshold_steps: tuple = (),
    no_value: str | None = None,
) -> dict[str, Any]:
    """A single-value panel (last value, with its sparkline)."""
    defaults: dict[str, Any] = {"unit": unit, "thresholds": thresholds(*threshold_steps)}
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "area",
        "textMode": "auto",
    }
    return _panel("stat", title, description, grid, _limits(defaults, None, no_value), [], options,
                  [target("A", expr, "")])


def row(title: str, y: int) -> dict[str, Any]:
    """A row header across the full width."""
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def dashed(series_name: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """An override drawing one named series dashed (alert lines, thresholds)."""
    return {
        "matcher": {"id": "byName", "options": series_name},
        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}, *extra],
    }
