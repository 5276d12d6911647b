"""Readers for the stack's config files and the telemetry contract, shared by the stack tests."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
COLLECTOR = REPO / "collector-config" / "otel-collector.yaml"
TEMPO = REPO / "tempo" / "tempo.yaml"
PROMETHEUS_DIR = REPO / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
RECORDING = PROMETHEUS_DIR / "recording.yml"
DASHBOARD = REPO / "grafana" / "dashboards" / "traceml-training.json"
GRAFANA_DATASOURCES = REPO / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
GRAFANA_DASHBOARDS = REPO / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
TELEMETRY_DOC = REPO / "docs" / "telemetry.md"
STACK_DOC = REPO / "docs" / "observability-stack.md"

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@cache
def contract_prometheus_names() -> frozenset[str]:
    """Every series name in the Prometheus column of the metrics table in docs/telemetry.md.

    ``traceml_step_duration_seconds_{bucket,sum,count}`` expands to its three names.
    """
    text = TELEMETRY_DOC.read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip().lower() for cell in rows[0].strip("|").split("|")]
    column = next(i for i, cell in enumerate(header) if cell.startswith("prometheus name"))
    names: set[str] = set()
    for row in rows[2:]:
        cell = row.strip("|").split("|")[column]
        for token in re.findall(r"`([^`]+)`", cell):
            match = re.fullmatch(r"(\w+)\{([\w,]+)\}", token)
            if match:
                names.update(f"{match[1]}{suffix}" for suffix in match[2].split(","))
            else:
                names.add(token)
    return frozenset(names)


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (a lexical scan, enough for our rules and panels)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery selectors
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    text = re.sub(r"(?<![\w:])\d[\w.+-]*", " ", text)  # numbers (1e9, 0.5, 1073741824)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        word = match[0]
        if word.lower() in _PROMQL_WORDS or text[match.end() :].lstrip().startswith("("):
            continue  # keyword or function call
        names.add(word)
    return names


def rule_groups(path: Path) -> list[dict[str, Any]]:
    return list(load_yaml(path)["groups"])


def rules(path: Path) -> Iterator[dict[str, Any]]:
    for group in rule_groups(path):
        yield from group["rules"]


def dashboard_targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query in the dashboard, rows' nested panels included."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner, target


def prometheus_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL in the dashboard: Prometheus panel targets and query variables."""
    exprs = [
        t["expr"]
        for p, t in dashboard_targets(dashboard)
        if (t.get("datasource") or {}).get("type") != "tempo"
    ]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = (re.fullmatch(r"label_values\((.*),\s*\w+\)", query.strip())
                     or re.fullmatch(r"query_result\((.*)\)", query.strip()))  # Grafana's, around PromQL
            exprs.append(match[1] if match else query)
    return exprs


def substitute_grafana_vars(
    expr: str, run_id: str, rate_interval: str = "15s", job: str | None = None
) -> str:
    """The PromQL Grafana would send for one run (of ``job``, default: the run id) and all ranks."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", "5m")
        .replace("${job}", job or run_id)
        .replace("$job", job or run_id)
        .replace("${run_id}", run_id)
        .replace("$run_id", run_id)
        .replace("${rank}", ".*")
        .replace("$rank", ".*")
    )
