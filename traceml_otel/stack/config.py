"""What a platform team sets when it renders the stack: selector, links, windows and `for:` durations."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from traceml_otel.errors import TracemlError

_DURATION = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$")
_UNIT_SECONDS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*(?:,|$)')
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DEFAULT_LINGER_S = 20.0
"""The emitter's default TRACEML_PROMETHEUS_LINGER_S."""
LINGER_MARGIN_S = 5.0
"""A linger must exceed the scrape interval by this much (the scrape's own duration and reply)."""


DEFAULT_RUNBOOK_URL = "docs/observability-stack.md"
DEFAULT_DASHBOARD_URL = "http://127.0.0.1:3000/d/traceml-training"
DEFAULT_POD_LABELS = (("traceml.io/scrape", "true"),)
DEFAULT_TARGET_JOBS = ".*traceml.*|otel-collector"
"""Scrape jobs serving traceml metrics: a PodMonitor's ``<namespace>/traceml-otel``, the compose collector."""


class StackConfigError(TracemlError, ValueError):
    """A render setting cannot be used."""


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration (``1h30m``, ``90s``)."""
    if not text or not _DURATION.match(text):
        raise StackConfigError(f"{text!r} is not a Prometheus duration (like 30s, 5m, 1h30m)")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|[ywdhms])", text))


def parse_selector(text: str) -> tuple[tuple[str, str, str], ...]:
    """``job="train", namespace=~"ml-.*"`` -> matchers; raises on anything else."""
    text = text.strip().strip("{}").strip()
    matchers, position = [], 0
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None or match.end() == position:
            raise StackConfigError(f'cannot read a label matcher at {text[position:]!r} (use label="value")')
        matchers.append((match[1], match[2], match[3]))
        position = match.end()
    return tuple(matchers)


def format_selector(matchers: tuple[tuple[str, str, str], ...]) -> str:
    """Matchers as PromQL, each followed by a comma (the form the templates splice in)."""
    return "".join(f'{label}{op}"{value}",' for label, op, value in matchers)


@dataclass(frozen=True, slots=True)
class Windows:
    """Range windows and `for:` durations of the rules (Prometheus durations)."""

    rate: str = "5m"
    """Window of every mean (step time, input wait share, skew, drift's current pace)."""
    baseline_history: str = "24h"
    """How far back the drift baseline (the run's best sustained pace) looks."""
    baseline_min_history: str = "15m"
    """A run needs this much pace history before drift can fire."""
    stall: str = "5m"
    """No completed step for this long is a stall."""
    missing_lookback: str = "1h"
    """A rank that vanished without a clean end is reported for this long."""
    drop_window: str = "5m"
    """Window of the dropped-spans and collector-refusal rates."""
    memory_window: str = "1h"
    memory_recent: str = "10m"
    memory_recent_offset: str = "25m"
    for_drift: str = "10m"
    for_straggler: str = "10m"
    for_input: str = "10m"
    for_stall: str = "2m"
    for_memory: str = "15m"
    for_missing: str = "2m"
    for_failed: str = "0s"
    """A failed run pages at the first evaluation that sees its exit status."""
    for_dropping: str = "1m"
    goodput_window: str = "1h"
    """Window of the goodput the TraceMLGoodputLow alert reads (start-up must have left it)."""
    for_goodput: str = "15m"
    for_ranks_missing: str = "5m"
    """Grace period before "ranks live < world size" pages (ranks still starting are not missing)."""
    for_target_down: str = "5m"
    stall_unwatched: str = "30m"
    """No rank of a run completed a step for this long and no hang watchdog reported a hang: the
    watchdog is off, or the run hangs inside an outside_step block (evaluation, checkpoint), which
    the watchdog never reports. Much longer than a step's stall: a marked evaluation may last."""
    for_hang: str = "30s"
    """How long a hang watchdog's report holds before the hang pages (the report itself comes after
    the watchdog's timeout, 60 s by default: the page follows within 2 min of the verdict)."""

    @classmethod
    def short(cls) -> Windows:
        """Seconds instead of minutes, for a live test against a 1 s scrape and evaluation interval."""
        return cls(
            rate="20s", baseline_history="30m", baseline_min_history="15s", stall="10s",
            missing_lookback="5m",
            drop_window="20s", memory_window="2m", memory_recent="20s", memory_recent_offset="50s",
            for_drift="6s", for_straggler="6s", for_input="6s", for_stall="3s", for_memory="10s",
            for_missing="3s", for_failed="0s", for_dropping="3s", goodput_window="40s", for_goodput="6s",
            stall_unwatched="60s", for_hang="2s", for_ranks_missing="10s", for_target_down="10s",
        )

    def with_overrides(self, overrides: dict[str, str]) -> Windows:
        names = {f.name for f in fields(self)}
        unknown = set(overrides) - names
        if unknown:
            raise StackConfigError(f"unknown window(s) {sorted(unknown)}; known: {sorted(names)}")
        return replace(self, **overrides)

    def validate(self) -> None:
        for f in fields(self):
            duration_seconds(getattr(self, f.name))


@dataclass(frozen=True, slots=True)
class StackConfig:
    """Everything `traceml stack render` takes. The defaults render the files shipped in the repo."""

    selector: tuple[tuple[str, str, str], ...] = ()
    """Matchers added to every selector of a traceml metric (e.g. job, namespace, cluster)."""
    collector_selector: tuple[tuple[str, str, str], ...] = ()
    """Matchers for the collector's own metrics (e.g. job="otel-collector-internal")."""
    runbook_url: str = DEFAULT_RUNBOOK_URL
    """Base of each alert's runbook_url; the alert's anchor (#tracemlsteptimedrift) is appended."""
    dashboard_url: str = DEFAULT_DASHBOARD_URL
    """The dashboard alerts link to (dashboard_url annotation, with ?var-run_id=...)."""
    windows: Windows = field(default_factory=Windows)
    namespace: str | None = None
    """Namespace of the Kubernetes objects (none: the one kubectl applies them to)."""
    manifest_labels: tuple[tuple[str, str], ...] = ()
    """Labels on the PrometheusRule and PodMonitor (what the Prometheus operator selects on)."""
    pod_labels: tuple[tuple[str, str], ...] = DEFAULT_POD_LABELS
    """The PodMonitor selects training pods with these labels."""
    ranks_per_pod: int = 1
    """Scrape ports per pod: traceml-0 ... traceml-(N-1), one per local rank."""
    scrape_interval: str = "15s"
    pod_namespaces: tuple[str, ...] = ()
    """Namespaces the PodMonitor looks for training pods in (``*``: every namespace); empty: the
    selector's ``namespace="..."`` if it has one, else the PodMonitor's own namespace."""
    target_jobs: str = DEFAULT_TARGET_JOBS
    """Regex of the scrape jobs that serve traceml metrics (a PodMonitor's job is
    ``<namespace>/<name>``): TraceMLScrapeTargetDown watches their ``up``."""
    linger_s: float = DEFAULT_LINGER_S
    """The TRACEML_PROMETHEUS_LINGER_S the training pods run with (checked against the scrape interval)."""

    @property
    def min_linger_s(self) -> float:
        """The shortest endpoint linger that lets every scraper at ``scrape_interval`` see the end."""
        return max(DEFAULT_LINGER_S, duration_seconds(self.scrape_interval) + LINGER_MARGIN_S)

    def monitored_namespaces(self) -> tuple[str, ...]:
        """Where the PodMonitor looks: the explicit list, else the selector's namespace(s)."""
        if self.pod_namespaces:
            return self.pod_namespaces
        for label, op, value in self.selector:
            if label == "namespace" and op == "=":
                return (value,)
            if label == "namespace" and op == "=~" and all(_DNS_LABEL.match(v) for v in value.split("|")):
                return tuple(value.split("|"))
        return ()

    def validate(self) -> None:
        self.windows.validate()
        duration_seconds(self.scrape_interval)
        for text in (self.runbook_url, self.dashboard_url):
            if not text or any(ch in text for ch in '<>"\n{} ') or text != text.strip():
                raise StackConfigError(f"{text!r} is not a usable URL")
        if "#" in self.dashboard_url or "#" in self.runbook_url:
            raise StackConfigError("the dashboard and runbook URLs may not carry a #fragment "
                                   "(the alert's anchor or ?var-run_id= is appended)")
        interval = duration_seconds(self.scrape_interval)
        if self.linger_s < interval + LINGER_MARGIN_S:
            raise StackConfigError(
                f"a {self.scrape_interval} scrape interval needs the training pods' endpoint to linger at "
                f"least {interval + LINGER_MARGIN_S:g} s after the end, or a clean end pages as "
                f"TraceMLTelemetryMissing: run them with TRACEML_PROMETHEUS_LINGER_S="
                f"{interval + LINGER_MARGIN_S:g} and pass --linger {interval + LINGER_MARGIN_S:g}")
        if any(ch in self.target_jobs for ch in '`%"\n'):
            raise StackConfigError("--target-jobs may not contain ` % \" or a newline")
        for label, _, value in (*self.selector, *self.collector_selector):
            if any(ch in value for ch in "`%"):  # they would break the alert templates' queries
                raise StackConfigError(f"the value of {label} may not contain ` or %")
        if self.ranks_per_pod < 1:
            raise StackConfigError("ranks_per_pod must be >= 1")
        for key, value in (*self.manifest_labels, *self.pod_labels):
            if not kubernetes_label_key(key) or not _LABEL_VALUE.match(value):
                raise StackConfigError(
                    f"{key}={value!r} is not a valid Kubernetes label (key: [prefix/]name; value: at most "
                    "63 of A-Z a-z 0-9 - _ . starting and ending alphanumeric)")
        namespaces = [self.namespace] if self.namespace is not None else []
        namespaces += [n for n in self.monitored_namespaces() if n != "*"]
        for namespace in namespaces:
            if not _DNS_LABEL.match(namespace):
                raise StackConfigError(f"{namespace!r} is not a Kubernetes namespace name (at most 63 of "
                                       "a-z 0-9 -, starting and ending alphanumeric)")
        if "*" in self.pod_namespaces and len(self.pod_namespaces) > 1:
            raise StackConfigError("--pod-namespace '*' (every namespace) cannot be combined with names")


def kubernetes_label_key(key: str) -> bool:
    """``[prefix/]name``: a DNS subdomain prefix and a name of at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    return bool(_LABEL_NAME.match(name)) and (not slash or bool(_DNS_SUBDOMAIN.match(prefix)))


def parse_pairs(items: list[str] | None, what: str) -> tuple[tuple[str, str], ...]:
    """``key=value`` arguments -> pairs."""
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise StackConfigError(f"{what} {item!r} is not key=value")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)
