"""Static checks of the observability stack: compose, collector, Tempo, Prometheus, Grafana.

Docker does not run on the machines these tests run on, so nothing here starts a container:
the files are parsed and cross-checked, and `promtool` validates the Prometheus config and
unit-tests the alert rules. test_stack_live.py runs a real Prometheus server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.integration.stack_files import (
    ALERTS,
    COLLECTOR,
    COMPOSE,
    GRAFANA_DASHBOARDS,
    GRAFANA_DATASOURCES,
    PROMETHEUS_DIR,
    RECORDING,
    REPO,
    STACK_DOC,
    TELEMETRY_DOC,
    TEMPO,
    contract_prometheus_names,
    dashboard_targets,
    load_dashboard,
    load_yaml,
    prometheus_exprs,
    promql_metric_names,
    rules,
)
from tests.tools import PROMTOOL, requires_tool

SERVICES = {"otel-collector", "tempo", "prometheus", "grafana"}
needs_promtool = requires_tool("promtool")


def compose_services() -> dict[str, Any]:
    return dict(load_yaml(COMPOSE)["services"])


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Host path (relative to the repo) -> container path, for ./ bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = (
            volume.split(":")[:2] if isinstance(volume, str) else (volume["source"], volume["target"])
        )
        if source.startswith("./"):
            mounts[source[2:]] = target
    return mounts


# --- docker-compose ---------------------------------------------------------------


def test_compose_defines_the_four_services() -> None:
    assert set(compose_services()) == SERVICES


def test_compose_bind_mounts_exist() -> None:
    mounted = {(name, source) for name, service in compose_services().items()
               for source in bind_mounts(service)}
    assert {name for name, _ in mounted} == SERVICES  # every service mounts its configuration
    for name, source in sorted(mounted):
        assert (REPO / source).exists(), f"{name} mounts missing ./{source}"


def test_compose_publishes_ports_on_localhost_only() -> None:
    published = [(name, port) for name, service in compose_services().items()
                 for port in service.get("ports", [])]
    assert {name for name, _ in published} >= {"grafana", "prometheus"}  # what a user opens in a browser
    for name, port in published:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", f"{name} publishes {port!r} beyond 127.0.0.1"


def test_compose_images_are_pinned() -> None:
    assert set(compose_services()) == SERVICES
    for name, service in compose_services().items():
        assert re.search(r":v?\d+\.\d+\.\d+$", service["image"]), f"{name}: pin the image version"


def test_prometheus_service_stores_exemplars_and_mounts_its_rules() -> None:
    service = compose_services()["prometheus"]
    assert "--enable-feature=exemplar-storage" in service["command"]
    config_path = next(a.split("=", 1)[1] for a in service["command"] if a.startswith("--config.file="))
    mounts = bind_mounts(service)
    assert mounts["prometheus/prometheus.yml"] == config_path
    config_dir = Path(config_path).parent
    rule_files = load_yaml(PROMETHEUS_DIR / "prometheus.yml")["rule_files"]
    assert sorted(rule_files) == ["alerts.yml", "recording.yml"]
    for rule_file in rule_files:
        assert mounts[f"prometheus/{rule_file}"] == str(config_dir / rule_file)


def test_grafana_service_mounts_provisioning_and_dashboards() -> None:
    service = compose_services()["grafana"]
    mounts = bind_mounts(service)
    assert mounts["grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = load_yaml(GRAFANA_DASHBOARDS)["providers"][0]
    assert mounts["grafana/dashboards"] == provider["options"]["path"]
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/traceml-training.json"
    assert service["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# --- collector and Tempo --------------------------------------------------------------


def test_collector_pipelines_reference_defined_components() -> None:
    config = load_yaml(COLLECTOR)
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics"}
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            undefined = set(pipeline[kind]) - set(config[kind])
            assert not undefined, f"pipeline {name} uses undefined {kind}: {undefined}"
        assert pipeline["processors"][0] == "memory_limiter"
        assert pipeline["processors"][-1] == "batch"
        assert "debug" not in pipeline["exporters"], "the debug exporter is off by default"


def test_collector_exports_where_the_stack_expects() -> None:
    config = load_yaml(COLLECTOR)
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    tempo = config["exporters"]["otlp_grpc"]
    assert tempo["endpoint"] == "tempo:4317" and tempo["tls"]["insecure"] is True
    prom = config["exporters"]["prometheus"]
    assert prom["endpoint"] == "0.0.0.0:8889" and prom["enable_open_metrics"] is True
    assert load_yaml(TEMPO)["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(
        ":4317"
    )


def test_prometheus_scrapes_the_collector_exporter() -> None:
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_DIR / "prometheus.yml")["scrape_configs"]}
    targets = jobs["otel-collector"]["static_configs"][0]["targets"]
    assert targets == ["otel-collector:8889"]
    assert jobs["otel-collector"]["honor_labels"] is True


# --- Grafana ----------------------------------------------------------------------------


def test_datasources_link_exemplars_to_tempo() -> None:
    sources = {ds["type"]: ds for ds in load_yaml(GRAFANA_DATASOURCES)["datasources"]}
    destinations = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destinations == [
        {"name": "trace_id", "datasourceUid": sources["tempo"]["uid"], "urlDisplayLabel": "Open step trace"}
    ]
    assert sources["prometheus"]["url"] == "http://prometheus:9090"
    assert sources["tempo"]["url"] == "http://tempo:3200"


def test_dashboard_identity_and_variables() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "traceml-training"
    assert dashboard["schemaVersion"] == 42
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert (variables["tempo"]["type"], variables["tempo"]["query"]) == ("datasource", "tempo")
    run_id = variables["run_id"]
    assert run_id["type"] == "query" and run_id["datasource"]["uid"] == "${datasource}"
    # newest run first (by its last step over the range), not alphabetical; Grafana keeps the order
    assert run_id["query"]["query"] == ("query_result(sort_desc(topk(200, max by (traceml_run_id) "
                                        "(max_over_time(traceml_step_last_timestamp_seconds[$__range])))))")
    assert run_id["regex"] == '/traceml_run_id="([^"]+)"/' and run_id["sort"] == 0


def test_first_row_is_the_status_and_throughput_axes_are_split() -> None:
    dashboard = load_dashboard()
    first = [p for p in dashboard["panels"] if p["gridPos"]["y"] <= 1]
    assert first[0]["type"] == "row" and first[0]["title"] == "Status"
    titles = [p["title"] for p in first[1:]]
    assert titles[:3] == ["Exit status", "Hang culprit", "Ranks live (of the world size)"]
    ranks = first[3]
    assert "traceml_world_size" in ranks["targets"][0]["expr"]
    assert ranks["fieldConfig"]["defaults"]["thresholds"]["steps"][0]["color"] == "red"
    (throughput,) = [p for p in dashboard["panels"] if p["title"] == "Throughput (all ranks)"]
    (steps,) = throughput["fieldConfig"]["overrides"]
    assert steps["matcher"]["options"] == "steps/s"
    assert {"id": "custom.axisPlacement", "value": "right"} in steps["properties"]


def test_every_panel_uses_a_datasource_variable() -> None:
    dashboard = load_dashboard()
    allowed = {"prometheus": "${datasource}", "tempo": "${tempo}"}
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    targets = list(dashboard_targets(dashboard))
    assert len(panels) >= 10 and len(targets) >= len(panels)
    for panel in panels:
        assert allowed[panel["datasource"]["type"]] == panel["datasource"]["uid"], panel["title"]
    for panel, target in targets:
        assert target["datasource"] == panel["datasource"], panel["title"]


# Series of the exporters the dashboard joins through traceml_rank_info (their documented names).
JOINED_EXPORTERS = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_POWER_USAGE",
                    "node_cpu_seconds_total", "node_uname_info"}


def test_dashboard_promql_uses_only_contract_metrics() -> None:
    known = contract_prometheus_names() | {r["record"] for r in rules(RECORDING)} | JOINED_EXPORTERS
    exprs = prometheus_exprs(load_dashboard())
    assert len(exprs) >= 20
    for expr in exprs:
        names = promql_metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= known, f"not in docs/telemetry.md: {names - known} in {expr!r}"


def test_dashboard_step_time_panel_shows_exemplars() -> None:
    targets = [
        t
        for _, t in dashboard_targets(load_dashboard())
        if re.search(r"(?<![\w:])traceml_step_duration_seconds_bucket", t.get("expr", ""))
    ]  # the raw buckets (the recorded per-run ones carry no exemplars)
    assert targets and all(t.get("exemplar") is True for t in targets)
    assert all(re.search(r"histogram_quantile\(0\.(5|95),", t["expr"]) for t in targets)


def test_dashboard_traceql_uses_contract_names() -> None:
    doc = TELEMETRY_DOC.read_text()
    targets = [t for _, t in dashboard_targets(load_dashboard())]
    queries = [t["query"] for t in targets if t["datasource"]["type"] == "tempo"]
    names = [(query, name) for query in queries
             for name in re.findall(r'name = "([\w.]+)"', query) + re.findall(r"span\.([\w.]+) =", query)]
    assert queries and names
    for query, name in names:
        assert f"`{name}`" in doc, f"{name} (in {query!r}) is not in docs/telemetry.md"


def test_promql_name_scan() -> None:
    expr = 'rate(foo_total{a="b:c"}[5m] offset 1h) / on (x) group_left bar:baz * 1e9 > $thr'
    assert promql_metric_names(expr) == {"foo_total", "bar:baz"}


# --- Prometheus rules ---------------------------------------------------------------------


def test_rules_use_only_contract_metrics_and_recorded_series() -> None:
    built_in = {"ALERTS", "up"}
    known = contract_prometheus_names() | {r["record"] for r in rules(RECORDING)} | built_in
    assert len(list(rules(RECORDING))) >= 10 and len(list(rules(ALERTS))) >= 10
    for rule in [*rules(RECORDING), *rules(ALERTS)]:
        unknown = promql_metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule['record']}: {unknown}"


def test_alerts_have_severity_and_runbook() -> None:
    headings = {h.strip().lower() for h in re.findall(r"^#+ (.*)$", STACK_DOC.read_text(), flags=re.M)}
    assert len(list(rules(ALERTS))) >= 10
    for rule in rules(ALERTS):
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in headings, f"no heading '{anchor}' in {STACK_DOC.name}"


def promtool_cases() -> list[dict[str, Any]]:
    return [
        case
        for path in sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
        for test in load_yaml(path)["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_every_alert_has_firing_and_silent_unit_tests() -> None:
    cases = promtool_cases()
    alerts = {rule["alert"] for rule in rules(ALERTS)}
    assert len(alerts) >= 10 and sum(len(case["exp_alerts"]) for case in cases) >= len(alerts)
    for name in alerts:
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name}: no test where it fires"
        if name != "TraceMLHeartbeat":  # the dead-man's switch always fires
            assert any(not case["exp_alerts"] for case in mine), f"{name}: no test where it stays silent"
    for case in cases:
        for alert in case["exp_alerts"]:
            if case["alertname"] == "TraceMLHeartbeat":  # about the rules themselves
                continue
            if case["alertname"] in ("TraceMLCollectorRefusingTelemetry", "TraceMLScrapeTargetDown"):
                assert {"job", "instance"} <= set(alert["exp_labels"])
            else:
                assert "traceml_run_id" in alert["exp_labels"], case["alertname"]


def run_promtool(*args: str) -> None:
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_check_rules() -> None:
    run_promtool("check", "rules", "recording.yml", "alerts.yml")


@needs_promtool
def test_promtool_check_config() -> None:
    # Paths in prometheus.yml are relative to it, so this resolves the rule files in the repo.
    run_promtool("check", "config", "prometheus.yml")


@needs_promtool
def test_promtool_unit_tests(tmp_path: Path) -> None:
    """Every unit test of prometheus/tests, each test group in its own promtool, side by side (the
    drift shapes alone take about 25 s in one process). A group is its file's text cut at the test
    (no YAML round trip: 0x30 is a hexadecimal number to PyYAML, a series to promtool)."""
    (tmp_path / "tests").mkdir()
    for name in ("recording.yml", "alerts.yml"):  # the groups' rule_files: [../recording.yml, ...]
        shutil.copy(PROMETHEUS_DIR / name, tmp_path / name)
    groups = []
    for path in sorted((PROMETHEUS_DIR / "tests").glob("*.yml")):
        head, marker, body = path.read_text().partition("\ntests:\n")
        tests = re.split(r"(?m)^(?=  - )", body)[1:]
        assert marker and len(tests) == len(load_yaml(path)["tests"]), path.name
        for index, test in enumerate(tests):
            group = tmp_path / "tests" / f"{path.stem}-{index}.yml"
            group.write_text(head + marker + test)
            groups.append(group)
    assert len(groups) > len(list((PROMETHEUS_DIR / "tests").glob("*.yml"))) >= 8

    def run(group: Path) -> subprocess.CompletedProcess[str]:
        assert PROMTOOL is not None
        return subprocess.run([PROMTOOL, "test", "rules", str(group)], capture_output=True, text=True,
                              timeout=120)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(zip(groups, pool.map(run, groups), strict=True))
    failed = {group.name: r.stdout + r.stderr for group, r in results.items() if r.returncode != 0}
    assert failed == {}
