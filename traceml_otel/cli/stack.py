"""``traceml stack render``: the argument parser and the command."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from traceml_otel.cli.common import EXIT_ERROR, EXIT_OK
from traceml_otel.stack.config import (
    DEFAULT_DASHBOARD_URL,
    DEFAULT_LINGER_S,
    DEFAULT_POD_LABELS,
    DEFAULT_RUNBOOK_URL,
    DEFAULT_TARGET_JOBS,
    StackConfig,
    StackConfigError,
    Windows,
    parse_pairs,
    parse_selector,
)
from traceml_otel.stack.pod_spec import pod_gpus
from traceml_otel.stack.render import render_all, write_files


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``stack render`` and its options."""
    actions = parser.add_subparsers(dest="stack_command", required=True)
    render = actions.add_parser(
        "render", help="render Prometheus rules, the Grafana dashboard and Kubernetes manifests",
        description="Render prometheus/recording.yml, prometheus/alerts.yml, the Grafana dashboard "
                    "(provisioned and grafana.com import copy) and kubernetes/ PrometheusRule + PodMonitor "
                    "into DIR. "
                    "With no options it renders the files shipped in the repository.",
    )
    render.add_argument("-o", "--output", required=True, type=Path, help="folder to write into")
    render.add_argument("--selector", default="",
                        help='label matchers added to every traceml metric selector, e.g. '
                             '\'namespace="ml", cluster="a"\'')
    render.add_argument("--collector-selector", default="",
                        help="matchers for the collector's own metrics, e.g. 'job=\"otelcol\"'")
    render.add_argument("--runbook-url", default=DEFAULT_RUNBOOK_URL,
                        help="base of each alert's runbook_url (the alert's #anchor is appended)")
    render.add_argument("--dashboard-url", default=DEFAULT_DASHBOARD_URL,
                        help="dashboard the alerts link to (dashboard_url annotation)")
    render.add_argument("--profile", choices=("default", "short"), default="default",
                        help="window set: 'short' uses seconds, for tests against a 1 s scrape interval")
    names = ", ".join(f.name for f in fields(Windows))
    render.add_argument("--window", action="append", metavar="NAME=DURATION",
                        help=f"override one window or for: duration ({names})")
    render.add_argument("--namespace", help="namespace of the Kubernetes objects")
    render.add_argument("--label", action="append", metavar="KEY=VALUE",
                        help="label on the PrometheusRule and PodMonitor (e.g. release=my-prometheus)")
    render.add_argument("--pod-label", action="append", metavar="KEY=VALUE",
                        help="the PodMonitor selects pods with these labels (default traceml.io/scrape=true)")
    render.add_argument("--ranks-per-pod", type=int, default=None,
                        help="scrape ports per pod, named traceml-0 ... (one per local rank); default: "
                             "the GPUs a container of --pod-spec asks for, else 1")
    render.add_argument("--pod-spec", type=Path, metavar="FILE",
                        help="the training workload's Kubernetes manifest (Job, JobSet, PyTorchJob, Pod; "
                             "YAML or JSON): its nvidia.com/gpu request sets --ranks-per-pod")
    render.add_argument("--scrape-interval", default="15s",
                        help="PodMonitor scrape interval (at most --linger minus 5 s)")
    render.add_argument("--linger", type=float, default=DEFAULT_LINGER_S, metavar="SECONDS",
                        help="the TRACEML_PROMETHEUS_LINGER_S the training pods run with (default 20): "
                             "render refuses a scrape interval a clean end could not be seen at")
    render.add_argument("--target-jobs", default=DEFAULT_TARGET_JOBS, metavar="REGEX",
                        help="scrape jobs serving traceml metrics, whose up TraceMLScrapeTargetDown "
                             "watches (default: %(default)s)")
    render.add_argument("--pod-namespace", action="append", metavar="NAME",
                        help="namespace the PodMonitor looks for training pods in (repeatable; '*' for "
                             "every namespace); default: the --selector's namespace=\"...\", else the "
                             "PodMonitor's own")


def config_from_args(args: argparse.Namespace) -> StackConfig:
    """The render configuration the options describe (raises StackConfigError)."""
    windows = Windows.short() if args.profile == "short" else Windows()
    windows = windows.with_overrides(dict(parse_pairs(args.window, "--window")))
    pod_labels = parse_pairs(args.pod_label, "--pod-label") or DEFAULT_POD_LABELS
    return StackConfig(
        selector=parse_selector(args.selector), collector_selector=parse_selector(args.collector_selector),
        runbook_url=args.runbook_url, dashboard_url=args.dashboard_url, windows=windows,
        namespace=args.namespace, manifest_labels=parse_pairs(args.label, "--label"), pod_labels=pod_labels,
        ranks_per_pod=ranks_per_pod(args)[0], scrape_interval=args.scrape_interval,
        pod_namespaces=tuple(args.pod_namespace or ()), linger_s=args.linger, target_jobs=args.target_jobs,
    )


def ranks_per_pod(args: argparse.Namespace) -> tuple[int, str]:
    """The scrape ports per pod and why: ``--ranks-per-pod``, else the GPUs ``--pod-spec`` asks for,
    else 1 (raises StackConfigError on an unreadable spec)."""
    gpus = pod_gpus(args.pod_spec) if getattr(args, "pod_spec", None) else None
    given = getattr(args, "ranks_per_pod", None)
    if given is not None:
        if gpus is not None and given < gpus.count:
            return given, (f"--ranks-per-pod {given}, but {args.pod_spec} asks for {gpus.count} GPUs "
                           f"({gpus.where}): the ranks past {given} are never scraped")
        return given, ""
    if gpus is not None:
        return gpus.count, f"{gpus.count} ranks per pod: the GPUs {args.pod_spec} asks for ({gpus.where})"
    if getattr(args, "pod_spec", None):
        return 1, f"{args.pod_spec} asks for no GPU: 1 rank per pod (pass --ranks-per-pod otherwise)"
    return 1, ""


def run_stack(args: argparse.Namespace) -> int:
    """Render into ``args.output``; 2 on a bad option."""
    try:
        config = config_from_args(args)
        files = render_all(config)
    except StackConfigError as error:
        print(f"traceml stack render: {error}", file=sys.stderr)
        return EXIT_ERROR
    for path in write_files(files, args.output):
        print(path)
    note = ranks_per_pod(args)[1]
    if note:
        print(f"traceml stack render: note: {note}", file=sys.stderr)
    for flag, value, default in (("--runbook-url", config.runbook_url, DEFAULT_RUNBOOK_URL),
                                 ("--dashboard-url", config.dashboard_url, DEFAULT_DASHBOARD_URL)):
        if value == default:
            print(f"traceml stack render: note: the alerts link to the placeholder {value!r}; pass {flag} "
                  "with the address your on-call can open", file=sys.stderr)
    return EXIT_OK
