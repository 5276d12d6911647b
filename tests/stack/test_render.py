"""`traceml stack render`: the shipped files are its default output; options reach every rule and panel."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tools import PROMTOOL, requires_tool
from traceml_otel.cli import main
from traceml_otel.stack import StackConfig, StackConfigError, Windows, render_all
from traceml_otel.stack.config import parse_selector

REPO = Path(__file__).resolve().parents[2]
SELECTOR = 'namespace="ml-prod", cluster=~"eu-.*"'
RUN_METRIC = re.compile(r"(?<![\w:])(traceml_[a-z_]+)(?![\w:])(\{[^}]*\})?")


def rules_of(files: dict[str, str]) -> list[dict[str, Any]]:
    return [rule for path in ("prometheus/recording.yml", "prometheus/alerts.yml")
            for group in yaml.safe_load(files[path])["groups"] for rule in group["rules"]]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for inner in [p, *p.get("panels", [])]
             for t in inner.get("targets", []) if "expr" in t]
    exprs += [a["expr"] for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            query = query["query"] if isinstance(query, dict) else query
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query))
    return exprs


def selectors_of(expr: str) -> list[tuple[str, str]]:
    """(metric, matcher block) for every raw traceml metric an expression selects."""
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    blocks = [m.span() for m in re.finditer(r'\{[^}]*\}|"[^"]*"', expr)]  # matchers and strings
    return [(m[1], m[2] or "") for m in RUN_METRIC.finditer(expr)
            if not any(start < m.start() < end for start, end in blocks)]


def test_shipped_files_are_the_default_render() -> None:
    for path, text in render_all().items():
        shipped = REPO / path
        assert shipped.exists(), f"{path} is not in the repository: run `traceml stack render -o .`"
        assert shipped.read_text() == text, f"{path} differs from the render: run `traceml stack render -o .`"


@pytest.mark.parametrize("name", ["drift", "goodput"])
def test_generated_promtool_tests_are_up_to_date(tmp_path: Path, name: str) -> None:
    for script in ("make_drift_test.py", f"make_{name}_test.py"):  # the goodput one imports the drift one
        (tmp_path / script).write_text((REPO / "prometheus" / "tests" / script).read_text())
    subprocess.run([sys.executable, str(tmp_path / f"make_{name}_test.py")], check=True, timeout=60)
    expected = (REPO / "prometheus" / "tests" / f"{name}_test.yml").read_text()
    assert (tmp_path / f"{name}_test.yml").read_text() == expected


def test_selector_reaches_every_metric_selector_in_rules_and_dashboard() -> None:
    files = render_all(StackConfig(selector=parse_selector(SELECTOR),
                                   collector_selector=parse_selector('job="otelcol"')))
    exprs = [rule["expr"] for rule in rules_of(files)]
    exprs += dashboard_exprs(json.loads(files["grafana/dashboards/traceml-training.json"]))
    seen = 0
    for expr in exprs:
        for metric, matchers in selectors_of(expr):
            seen += 1
            assert 'namespace="ml-prod"' in matchers and 'cluster=~"eu-.*"' in matchers, (metric, expr)
    assert seen > 40
    (collector,) = [r for r in rules_of(files) if r.get("alert") == "TraceMLCollectorRefusingTelemetry"]
    assert '{job="otelcol",__name__=~' in collector["expr"]
    # the query inside the stall alert's description is scoped too
    (stalled,) = [r for r in rules_of(files) if r.get("alert") == "TraceMLTrainingStalled"]
    assert ('traceml_progress_stalled_seconds{namespace="ml-prod",cluster=~"eu-.*",traceml_run_id=%q,'
            'traceml_rank=%q,traceml_phase_name!~"collective|none"}') in stalled["annotations"]["description"]


def test_default_selector_leaves_no_empty_matchers() -> None:
    files = render_all()
    exprs = [rule["expr"] for rule in rules_of(files)]
    exprs += dashboard_exprs(json.loads(files["grafana/dashboards/traceml-training.json"]))
    for expr in exprs:
        assert "{}" not in expr and ",}" not in expr and "<sel>" not in expr, expr


def test_urls_in_every_alert() -> None:
    config = StackConfig(runbook_url="https://runbooks.example.com/traceml",
                         dashboard_url="https://grafana.example.com/d/traceml-training")
    alerts = [r for r in rules_of(render_all(config)) if "alert" in r]
    assert len({a["alert"] for a in alerts}) == 18
    for alert in alerts:
        annotations = alert["annotations"]
        assert annotations["runbook_url"] == f"https://runbooks.example.com/traceml#{alert['alert'].lower()}"
        if "traceml_run_id" in alert["expr"] or "run:" in alert["expr"]:
            assert annotations["dashboard_url"] == (
                "https://grafana.example.com/d/traceml-training?var-run_id={{ $labels.traceml_run_id }}"
            )


def test_windows_and_for_durations_are_applied() -> None:
    short = rules_of(render_all(StackConfig(windows=Windows.short())))
    default = rules_of(render_all())
    drift = next(r for r in short if r.get("alert") == "TraceMLStepTimeDrift")
    assert drift["for"] == "6s"
    assert next(r for r in default if r.get("alert") == "TraceMLStepTimeDrift")["for"] == "10m"
    mean = next(r for r in short if r.get("record") == "run_rank:traceml_step_duration_seconds:rate")
    assert "[20s]" in mean["expr"] and "[5m]" not in mean["expr"]
    stalled = next(r for r in short if r.get("alert") == "TraceMLTrainingStalled")
    assert "> 60" in stalled["expr"] and stalled["for"] == "2s"  # no watchdog report: stall_unwatched
    rank = next(r for r in short if r.get("alert") == "TraceMLRankStalled")
    assert "> 10" in rank["expr"]
    assert next(r for r in default if r.get("alert") == "TraceMLTrainingStalled")["for"] == "30s"
    assert all("keep_firing_for" not in r for r in short)  # hysteresis instead: it would outlive the run
    custom = rules_of(render_all(StackConfig(windows=Windows().with_overrides({"for_drift": "30m"}))))
    assert next(r for r in custom if r.get("alert") == "TraceMLStepTimeDrift")["for"] == "30m"


def test_kubernetes_manifests_parse_as_objects() -> None:
    config = StackConfig(selector=parse_selector(SELECTOR), namespace="ml-prod",
                         manifest_labels=(("release", "kube-prometheus-stack"),),
                         pod_labels=(("app", "trainer"),), ranks_per_pod=4)
    files = render_all(config)
    rule = yaml.safe_load(files["kubernetes/prometheusrule.yaml"])
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "ml-prod"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    groups = [g for path in ("prometheus/recording.yml", "prometheus/alerts.yml")
              for g in yaml.safe_load(files[path])["groups"]]
    assert rule["spec"]["groups"] == groups
    monitor = yaml.safe_load(files["kubernetes/podmonitor.yaml"])
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"app": "trainer"}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [f"traceml-{i}" for i in range(4)]


def test_import_copy_has_inputs_and_keeps_the_variables() -> None:
    files = render_all()
    provisioned = json.loads(files["grafana/dashboards/traceml-training.json"])
    imported = json.loads(files["grafana/import/traceml-training.grafana-com.json"])
    assert "__inputs" not in provisioned
    assert {i["name"]: i["pluginId"] for i in imported["__inputs"]} == {
        "DS_PROMETHEUS": "prometheus", "DS_TEMPO": "tempo"}
    assert imported["schemaVersion"] == provisioned["schemaVersion"]
    assert imported["panels"] == provisioned["panels"]  # panels still use ${datasource} / ${tempo}
    variables = {v["name"]: v for v in imported["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "${DS_PROMETHEUS}"


@requires_tool("promtool")
@pytest.mark.parametrize("profile", ["default", "short"])
def test_rendered_rules_pass_promtool(tmp_path: Path, profile: str) -> None:
    assert main(["stack", "render", "-o", str(tmp_path), "--profile", profile, "--selector", SELECTOR]) == 0
    result = subprocess.run([PROMTOOL, "check", "rules", "recording.yml", "alerts.yml"],
                            cwd=tmp_path / "prometheus", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("option", [
    ["--selector", "job=train"], ["--window", "rate=5 minutes"], ["--window", "bogus=1m"],
    ["--runbook-url", 'http://x/"y'], ["--selector", 'job="a`b"'], ["--label", "novalue"],
    ["--namespace", "Monitoring"], ["--pod-namespace", "ml_training"], ["--label", "bad key=x"],
    ["--pod-label", "app=" + "x" * 64], ["--dashboard-url", "https://g/d/x#panel"],
    ["--scrape-interval", "60s"], ["--scrape-interval", "30s", "--linger", "30"],
    ["--pod-namespace", "*", "--pod-namespace", "a"],
])
def test_bad_options_are_refused(
    tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stack", "render", "-o", str(tmp_path), *option]) == 2
    assert "traceml stack render:" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_selector_parsing() -> None:
    assert parse_selector('{job="a", ns!~"b.*",}') == (("job", "=", "a"), ("ns", "!~", "b.*"))
    assert parse_selector("") == ()
    with pytest.raises(StackConfigError):
        parse_selector('job="a" ns="b"')


def test_dashboard_url_with_a_query_string_is_joined_with_an_ampersand() -> None:
    files = render_all(StackConfig(dashboard_url="https://g/d/x?orgId=1"))
    links = [r["annotations"]["dashboard_url"] for r in rules_of(files) if "dashboard_url" in r.get(
        "annotations", {})]
    assert len(links) >= 10
    assert all(link.startswith("https://g/d/x?orgId=1&var-run_id={{") for link in links)
    assert all(link.count("?") == 1 for link in links)


def test_scrape_interval_and_linger_pairs() -> None:
    files = render_all(StackConfig(scrape_interval="60s", linger_s=65))
    monitor = yaml.safe_load(files["kubernetes/podmonitor.yaml"])
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "60s"
    assert "TRACEML_PROMETHEUS_LINGER_S >= 65" in files["kubernetes/podmonitor.yaml"]
    with pytest.raises(StackConfigError, match="TRACEML_PROMETHEUS_LINGER_S=65"):
        render_all(StackConfig(scrape_interval="60s"))
    render_all(StackConfig(scrape_interval="15s"))  # the default 20 s linger covers 15 s


def test_import_copy_requires_the_grafana_its_schema_needs() -> None:
    from traceml_otel.stack.render import GRAFANA_FOR_SCHEMA

    imported = json.loads(render_all()["grafana/import/traceml-training.grafana-com.json"])
    (grafana,) = [r for r in imported["__requires"] if r["id"] == "grafana"]
    assert grafana["version"] == GRAFANA_FOR_SCHEMA[imported["schemaVersion"]]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["grafana"]["image"] == f"grafana/grafana:{grafana['version']}"


def _selects(monitor: dict[str, Any], monitor_namespace: str, pod_namespace: str,
             pod_labels: dict[str, str], pod_ports: list[str]) -> bool:
    """Whether the prometheus-operator would scrape the pod: its namespaceSelector (absent: the
    PodMonitor's own namespace only), matchLabels, and a named port an endpoint asks for."""
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector")
    if namespaces is None:
        in_namespace = pod_namespace == monitor_namespace
    elif namespaces.get("any"):
        in_namespace = True
    else:
        in_namespace = pod_namespace in namespaces.get("matchNames", [])
    labels = spec["selector"]["matchLabels"]
    ports = {e["port"] for e in spec["podMetricsEndpoints"]}
    return in_namespace and all(pod_labels.get(k) == v for k, v in labels.items()) and bool(ports & set(
        pod_ports))


def test_readme_kubernetes_example_scrapes_the_training_namespace(tmp_path: Path) -> None:
    import shlex

    readme = (REPO / "README.md").read_text()
    block = readme.split("## Alerts and dashboard in your monitoring stack", 1)[1].split("```sh", 1)[1]
    command = block.split("```", 1)[0]
    command = "\n".join(line.split("#", 1)[0] if line.lstrip().startswith("#") else line
                        for line in command.splitlines())
    command = "\n".join(line.split("  #", 1)[0] for line in command.splitlines())  # trailing comments
    render = command.split("traceml stack render", 1)[1].split("kubectl", 1)[0].replace("\\\n", " ")
    argv = shlex.split(render)
    argv[argv.index("-o") + 1] = str(tmp_path)
    job = tmp_path / "train-job.yaml"  # the README's training Job: 8 GPUs a pod
    job.write_text("kind: Job\nspec:\n  template:\n    spec:\n      containers:\n        - name: trainer\n"
                   "          resources: {limits: {nvidia.com/gpu: 8}}\n")
    argv[argv.index("--pod-spec") + 1] = str(job)
    assert main(["stack", "render", *argv]) == 0
    monitor = yaml.safe_load((tmp_path / "kubernetes" / "podmonitor.yaml").read_text())
    own = monitor["metadata"]["namespace"]
    assert own == "monitoring"
    trainer = {"traceml.io/scrape": "true"}
    assert _selects(monitor, own, "ml-training", trainer, ["traceml-0"])
    assert not _selects(monitor, own, "other-team", trainer, ["traceml-0"])
    assert not _selects(monitor, own, "ml-training", {}, ["traceml-0"])
    rule = yaml.safe_load((tmp_path / "kubernetes" / "prometheusrule.yaml").read_text())
    assert rule["metadata"]["namespace"] == "monitoring"
    # every local rank's port is scraped (8 GPUs a pod, read from --pod-spec), not only traceml-0
    ports = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert ports == [f"traceml-{i}" for i in range(8)]
    # without a namespaceSelector the operator looked only in its own namespace: the old bug
    del monitor["spec"]["namespaceSelector"]
    assert not _selects(monitor, own, "ml-training", trainer, ["traceml-0"])


def test_pod_namespaces_option() -> None:
    every = yaml.safe_load(render_all(StackConfig(pod_namespaces=("*",)))["kubernetes/podmonitor.yaml"])
    assert every["spec"]["namespaceSelector"] == {"any": True}
    two = yaml.safe_load(render_all(StackConfig(selector=parse_selector('namespace=~"team-a|team-b"')))[
        "kubernetes/podmonitor.yaml"])
    assert two["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert "namespaceSelector" not in yaml.safe_load(render_all()["kubernetes/podmonitor.yaml"])["spec"]
