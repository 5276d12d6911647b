"""Render the Prometheus rules, the Grafana dashboard and the Kubernetes manifests from one source.

The rule templates under ``templates/`` and the dashboard in :mod:`.dashboard` hold every rule
and panel once, with placeholders for what
a platform team sets (:class:`~traceml_otel.stack.config.StackConfig`): ``<sel>`` (the label
matchers added to every traceml metric selector), ``<csel>`` (the collector's), ``<runbook>``,
``<dashboard>`` and one ``<name>`` per window. Rendering is plain text substitution, so the
rule files keep their comments; the default configuration renders the files shipped in the
repository (a test keeps them equal).
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from traceml_otel.stack.config import StackConfig, duration_seconds, format_selector
from traceml_otel.stack.dashboard import build_dashboard

RECORDING_FILE = "prometheus/recording.yml"
ALERTS_FILE = "prometheus/alerts.yml"
DASHBOARD_FILE = "grafana/dashboards/traceml-training.json"
DASHBOARD_IMPORT_FILE = "grafana/import/traceml-training.grafana-com.json"
PROMETHEUS_RULE_FILE = "kubernetes/prometheusrule.yaml"
POD_MONITOR_FILE = "kubernetes/podmonitor.yaml"

_TOKEN = re.compile(r"<([a-z][a-z_]*)>")
GRAFANA_FOR_SCHEMA = {42: "12.3.0"}
"""Dashboard schemaVersion -> the Grafana release the import copy requires: the one it was built
for (docker-compose.yml pins it; Grafana 12.3 writes schema 42)."""


def _template(name: str) -> str:
    return resources.files("traceml_otel.stack").joinpath("templates", name).read_text(encoding="utf-8")


def substitutions(config: StackConfig) -> dict[str, str]:
    """Placeholder -> text for one configuration."""
    values = {f.name: getattr(config.windows, f.name) for f in fields(config.windows)}
    stall = duration_seconds(config.windows.stall)
    values |= {
        "sel": format_selector(config.selector),
        "csel": format_selector(config.collector_selector),
        "target_jobs": config.target_jobs,
        "runbook": config.runbook_url,
        "dashboard": config.dashboard_url,
        "dashboard_query": config.dashboard_url + ("&" if "?" in config.dashboard_url else "?"),
        "stall_seconds": f"{stall:g}",
        "stall_unwatched_seconds": f"{duration_seconds(config.windows.stall_unwatched):g}",
    }
    return values


def fill(text: str, config: StackConfig) -> str:
    """Substitute every placeholder; tidy ``{}`` and ``,}`` left by an empty or trailing selector."""
    values = substitutions(config)

    def one(match: re.Match[str]) -> str:
        name = match[1]
        if name not in values:
            raise KeyError(f"unknown placeholder <{name}> in a stack template")
        return values[name]

    text = _TOKEN.sub(one, text)
    text = re.sub(r"(?<=[\w:])\{\}", "", text)
    return text.replace(",}", "}")


def render_rules(config: StackConfig) -> dict[str, str]:
    """recording.yml and alerts.yml."""
    return {RECORDING_FILE: fill(_template("recording.yml"), config),
            ALERTS_FILE: fill(_template("alerts.yml"), config)}


def _fill_json(value: Any, config: StackConfig) -> Any:
    if isinstance(value, str):
        return fill(value, config)
    if isinstance(value, list):
        return [_fill_json(item, config) for item in value]
    if isinstance(value, dict):
        return {key: _fill_json(item, config) for key, item in value.items()}
    return value


def render_dashboard(config: StackConfig) -> dict[str, Any]:
    """The provisioned dashboard (datasource variables, no ``__inputs``)."""
    return _fill_json(build_dashboard(), config)


def import_copy(dashboard: dict[str, Any]) -> dict[str, Any]:
    """The grafana.com import form: ``__inputs`` pick the datasources, which then fill the variables."""
    copy = json.loads(json.dumps(dashboard))
    copy.pop("id", None)
    copy["__inputs"] = [
        {"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "where traceml metrics are",
         "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"},
        {"name": "DS_TEMPO", "label": "Tempo", "description": "where traceml step traces are",
         "type": "datasource", "pluginId": "tempo", "pluginName": "Tempo"},
    ]
    copy["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana",
         "version": GRAFANA_FOR_SCHEMA[dashboard["schemaVersion"]]},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        {"type": "datasource", "id": "tempo", "name": "Tempo", "version": "1.0.0"},
    ]
    for variable in copy["templating"]["list"]:
        if variable["name"] == "datasource":
            variable["current"] = {"selected": True, "text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}
        elif variable["name"] == "tempo":
            variable["current"] = {"selected": True, "text": "${DS_TEMPO}", "value": "${DS_TEMPO}"}
    return copy


def _yaml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid YAML double-quoted scalar


def _metadata(config: StackConfig, name: str) -> str:
    lines = ["metadata:", f"  name: {name}"]
    if config.namespace:
        lines.append(f"  namespace: {config.namespace}")
    labels = (("app.kubernetes.io/part-of", "traceml-otel"), *config.manifest_labels)
    lines.append("  labels:")
    lines += [f"    {key}: {_yaml_string(value)}" for key, value in labels]
    return "\n".join(lines)


def render_prometheus_rule(config: StackConfig, rules: dict[str, str]) -> str:
    """A prometheus-operator ``PrometheusRule`` holding both rule files' groups."""
    groups = []
    for path in (RECORDING_FILE, ALERTS_FILE):
        body = rules[path].split("\ngroups:\n", 1)[1]
        groups.append(body.rstrip("\n"))
    indented = "\n".join("  " + line if line else line for line in "\n".join(groups).splitlines())
    return (
        "# Rendered by `traceml stack render`: the rules of prometheus/recording.yml and alerts.yml.\n"
        "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"
        f"{_metadata(config, 'traceml-otel')}\n"
        f"spec:\n  groups:\n{indented}\n"
    )


def render_pod_monitor(config: StackConfig) -> str:
    """A ``PodMonitor`` scraping each rank's direct endpoint (one port per local rank)."""
    selector = "\n".join(f"      {key}: {_yaml_string(value)}" for key, value in config.pod_labels)
    namespaces = config.monitored_namespaces()
    if namespaces == ("*",):
        namespace_selector = "  namespaceSelector:\n    any: true\n"
    elif namespaces:
        names = "\n".join(f"      - {name}" for name in namespaces)
        namespace_selector = f"  namespaceSelector:\n    matchNames:\n{names}\n"
    else:
        namespace_selector = ""  # the operator then looks only in the PodMonitor's own namespace
    endpoints = "\n".join(
        f"    - port: traceml-{index}\n      interval: {config.scrape_interval}\n      scheme: http\n"
        "      path: /metrics"
        for index in range(config.ranks_per_pod)
    )
    return (
        "# Rendered by `traceml stack render`. Training pods run with TRACEML_PROMETHEUS_PORT=<P> and\n"
        "# TRACEML_PROMETHEUS_ADDR=0.0.0.0, and name their container ports traceml-0 (P),\n"
        "# traceml-1 (P+1), ... one per local rank. With this scrape interval they need\n"
        f"# TRACEML_PROMETHEUS_LINGER_S >= {config.min_linger_s:g} (every replica must scrape a clean end).\n"
        "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\n"
        f"{_metadata(config, 'traceml-otel')}\n"
        f"spec:\n{namespace_selector}  selector:\n    matchLabels:\n"
        f"{selector}\n"
        "  podMetricsEndpoints:\n"
        f"{endpoints}\n"
    )


def render_all(config: StackConfig | None = None) -> dict[str, str]:
    """Every rendered file: path relative to the output folder -> text."""
    config = config or StackConfig()
    config.validate()
    files = render_rules(config)
    dashboard = render_dashboard(config)
    files[DASHBOARD_FILE] = json.dumps(dashboard, indent=2) + "\n"
    files[DASHBOARD_IMPORT_FILE] = json.dumps(import_copy(dashboard), indent=2) + "\n"
    files[PROMETHEUS_RULE_FILE] = render_prometheus_rule(config, files)
    files[POD_MONITOR_FILE] = render_pod_monitor(config)
    return files


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write the rendered files under ``out_dir`` (folders created); returns the paths written."""
    written = []
    for relative, text in files.items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
