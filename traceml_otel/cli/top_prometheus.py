"""``traceml top --prometheus URL (--job J | --run-id ID)``: a fleet's live view, from the recording rules.

Each refresh is a handful of instant queries (:data:`QUERIES`), mostly of recorded series
(``prometheus/recording.yml``): per rank the step time, input wait, traced time, backward and exposed
collective time per step (the ``run_rank:`` rules), per run the phase split, rates, goodput, drops and
the live, missing and failed rank counts (the ``run:`` rules), plus each rank's steps done, stall
gauge and the age of its newest sample. From those it builds the analyzer's ``RankMetrics`` per rank
(forward, optimizer and H2D copies are the run's per-step means: metrics keep no per-rank phase
series) and runs the analyzer's rules (:func:`~traceml_otel.analyze.rules.diagnose_step_time`) for
the verdict. At any world size it prints a summary line, the slowest and fastest ``k`` ranks and a
distribution of the ranks' step times, never one row per rank. Each refresh says how many samples its
queries read (``stats=all``) and how long it took: docs/observability-stack.md has the table at
1,024 ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from traceml_otel.analyze.findings import RankMetrics
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.rules import diagnose_step_time
from traceml_otel.cli.common import EXIT_ERROR
from traceml_otel.report.live_view import ms, pct
from traceml_otel.sanitize import strip_control
from traceml_otel.wire.metric_labels import JOB_LABEL, PHASE_LABEL, RANK_LABEL, RUN_LABEL

SILENT_AFTER_S = 60.0
"""A rank whose newest sample is older than this is shown as not reporting (4 scrapes at 15 s)."""
MAX_REPLY_BYTES = 16 << 20
PARALLEL_QUERIES = 4
BARS = " ▁▂▃▄▅▆▇█"

QUERIES = {
    "step_time": ("run_rank:traceml_step_time_seconds:mean{S} or "
                  "run_rank:traceml_step_duration_seconds:mean{S}"),
    "input_wait": "run_rank:traceml_input_wait_seconds:per_step{S}",
    "traced": "run_rank:traceml_step_duration_seconds:mean{S}",
    "backward": "run_rank:traceml_backward_seconds_per_step:mean{S}",
    "exposed": "run_rank:traceml_collective_exposed_seconds:per_step{S}",
    "steps": f"max by ({RANK_LABEL}) (traceml_step_duration_seconds_count{{S}})",
    "age": f"time() - max by ({RANK_LABEL}) (timestamp(traceml_run_ended{{S}}))",
    "stalled": f"max by ({RANK_LABEL}, {PHASE_LABEL}) (traceml_progress_stalled_seconds{{S}}) > 0",
    "phases": "run:traceml_phase_seconds:per_step{S}",
    "run": ("label_replace(run:traceml_steps:rate{S}, 'q', 'steps_rate', '', '') or "
            "label_replace(run:traceml_samples:rate{S}, 'q', 'samples_rate', '', '') or "
            "label_replace(run:traceml_goodput:ratio{S}, 'q', 'goodput', '', '') or "
            "label_replace(run:traceml_export_dropped_spans:increase{S}, 'q', 'dropped', '', '') or "
            "label_replace(run:traceml_live_ranks:count{S}, 'q', 'live', '', '') or "
            "label_replace(run:traceml_missing_ranks:count{S}, 'q', 'missing', '', '') or "
            "label_replace(run:traceml_failed_ranks:count{S}, 'q', 'failed', '', '')"),
}
"""Every query of one refresh; ``{S}`` is the run's selector."""


@dataclass
class FleetView:
    """One refresh's answers, and what they cost."""

    run_id: str
    per_rank: dict[str, dict[int, float]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    run: dict[str, float] = field(default_factory=dict)
    stalled: dict[int, tuple[float, str]] = field(default_factory=dict)
    samples: int = 0
    queries: int = 0
    wall_s: float = 0.0
    query_s: dict[str, float] = field(default_factory=dict)


class PrometheusTop:
    """Queries one run's live view from a Prometheus-compatible API (see the module docstring)."""

    def __init__(self, url: str, run_id: str | None = None, job: str | None = None,
                 timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.run_id = run_id
        self.job = job
        self.timeout = timeout

    def _query(self, expr: str) -> tuple[list[dict[str, Any]], int]:
        params = urllib.parse.urlencode({"query": expr, "stats": "all"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=self.timeout) as reply:
            body = json.loads(reply.read(MAX_REPLY_BYTES))
        if body.get("status") != "success":
            raise RuntimeError(strip_control(str(body.get("error", "query failed")))[:300])
        data = body.get("data", {})
        samples = int(data.get("stats", {}).get("samples", {}).get("totalQueryableSamples", 0) or 0)
        return list(data.get("result") or []), samples

    def resolve_run(self) -> str | None:
        """The run id: given, or the newest live attempt of the job."""
        if self.run_id:
            return self.run_id
        job = json.dumps(self.job or "")
        result, _ = self._query(f"run:traceml_live_ranks:count{{{JOB_LABEL}={job}}}")
        runs = sorted(str(r.get("metric", {}).get(RUN_LABEL, "")) for r in result)
        return runs[-1] if runs else None

    def refresh(self, run_id: str) -> FleetView:
        """Run every query of :data:`QUERIES` once, a few at a time (the server runs them in parallel)."""
        began = time.monotonic()
        view = FleetView(run_id)
        selector = "{" + RUN_LABEL + "=" + json.dumps(run_id) + "}"

        def timed(name: str) -> tuple[str, list[dict[str, Any]], int, float]:
            started = time.monotonic()
            result, samples = self._query(QUERIES[name].replace("{S}", selector))
            return name, result, samples, time.monotonic() - started

        with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:
            answers = list(pool.map(timed, QUERIES))
        for name, result, samples, wall in answers:
            view.samples += samples
            view.queries += 1
            view.query_s[name] = wall
            for item in result:
                labels, value = item.get("metric", {}), _value(item)
                if value is None:
                    continue
                if name == "phases":
                    view.phases[str(labels.get(PHASE_LABEL, ""))] = value
                elif name == "run":
                    view.run[str(labels.get("q", ""))] = value
                elif name == "stalled":
                    rank = _rank(labels)
                    if rank is not None:
                        view.stalled[rank] = (value, strip_control(str(labels.get(PHASE_LABEL, ""))))
                else:
                    rank = _rank(labels)
                    if rank is not None:
                        view.per_rank.setdefault(name, {})[rank] = value
        view.wall_s = time.monotonic() - began
        return view


def _value(item: dict[str, Any]) -> float | None:
    try:
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _rank(labels: dict[str, Any]) -> int | None:
    try:
        return int(labels[RANK_LABEL])
    except (KeyError, TypeError, ValueError):
        return None


def rank_metrics(view: FleetView) -> list[RankMetrics]:
    """The analyzer's per-rank measures from one refresh (see the module docstring)."""
    ranks = view.per_rank
    forward, optimizer, h2d = (view.phases.get(p) for p in ("forward", "optimizer", "h2d"))
    out = []
    for rank, traced in sorted(ranks.get("traced", {}).items()):
        backward = ranks.get("backward", {}).get(rank, view.phases.get("backward"))
        exposed = ranks.get("exposed", {}).get(rank)
        compute = None if forward is None or backward is None else forward + backward + (optimizer or 0.0)
        residual = None if compute is None else max(
            0.0, traced - compute - (h2d or 0.0) - (exposed or 0.0))
        out.append(RankMetrics(
            rank=rank, steps=int(ranks.get("steps", {}).get(rank, 0)),
            step_time=ranks.get("step_time", {}).get(rank),
            input_wait=ranks.get("input_wait", {}).get(rank), traced=traced, forward=forward,
            backward=backward,
            optimizer=optimizer or 0.0, h2d=h2d or 0.0, h2d_measured=h2d is not None, compute=compute,
            residual=residual, optimizer_updates=None, micro_steps=0, communication=exposed,
            communication_measured=exposed is not None))
    return out


def _distribution(values: list[float], bins: int = 16) -> str:
    low, high = min(values), max(values)
    if high <= low:
        return f"all {ms(low)} ms"
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / (high - low) * bins))] += 1
    top = max(counts)
    bars = "".join(BARS[round(n / top * (len(BARS) - 1))] if n else " " for n in counts)
    return f"{ms(low)} ms |{bars}| {ms(high)} ms"


def render(view: FleetView, k: int = 5, silent_after_s: float = SILENT_AFTER_S) -> list[str]:
    """The fleet view as lines: summary, distribution, slowest/fastest ``k``, verdict, flags (bounded)."""
    step = view.per_rank.get("step_time", {})
    steps = view.per_rank.get("steps", {})
    ages = view.per_rank.get("age", {})
    world = len(set(steps) | set(ages))
    silent = sorted((rank, age) for rank, age in ages.items() if age > silent_after_s)
    run = view.run
    values = sorted(step.values())
    lines = [
        f"traceml top  run {view.run_id}  ranks {world - len(silent)}/{world} reporting"
        + (f"  steps {int(statistics.median(steps.values())):,} (min {int(min(steps.values())):,})"
           if steps else "")
        + (f"  {run['steps_rate'] / max(1, world):.3g} steps/s" if run.get("steps_rate") else "")
        + (f"  {run['samples_rate']:,.0f} samples/s" if run.get("samples_rate") else "")
        + (f"  goodput {pct(run['goodput'])}" if "goodput" in run else ""),
        f"step time  median {ms(statistics.median(values))} ms  min {ms(values[0])}  max {ms(values[-1])}"
        if values else "step time  - (no recorded step time yet)",
    ]
    if values:
        lines.append("per-rank distribution  " + _distribution(values))
        ordered = sorted(step.items(), key=lambda item: -item[1])
        lines.append("slowest  " + "  ".join(f"r{r} {ms(v)}" for r, v in ordered[:k]))
        lines.append("fastest  " + "  ".join(f"r{r} {ms(v)}" for r, v in reversed(ordered[-k:])))
    if view.phases:
        lines.append("phases per step (run)  " + "  ".join(f"{name} {ms(value)} ms" for name, value in
                                                           sorted(view.phases.items())))
    metrics = rank_metrics(view)
    if metrics:
        primary = diagnose_step_time(metrics, Clock.CPU, "none").primary
        lines.append(f"verdict {primary.kind}  {primary.why}")
    if silent:
        lines.append(f"NOT REPORTING: rank {','.join(f'{r}:{a:.0f}s' for r, a in silent[:8])}"
                     + (f",+{len(silent) - 8}" if len(silent) > 8 else ""))
    for rank, (seconds, phase) in sorted(view.stalled.items(), key=lambda item: -item[1][0])[:k]:
        lines.append(f"rank {rank} STALLED for {seconds:.0f}s in {phase}")
    if run.get("missing") or run.get("failed"):
        lines.append(f"missing ranks {int(run.get('missing', 0))}, failed ranks {int(run.get('failed', 0))}")
    if run.get("dropped"):
        lines.append(f"telemetry dropped {run['dropped']:.0f} span(s) in the last 5 m")
    lines.append(f"(refresh: {view.queries} queries, {view.samples:,} samples, {view.wall_s:.2f} s)")
    return [strip_control(line) for line in lines]


def run_top_prometheus(args: argparse.Namespace) -> int:
    """``traceml top --prometheus``: refresh until Ctrl-C (``--once``: one refresh)."""
    if not (args.job or args.run_id):
        print("traceml top: error: --prometheus needs --job or --run-id", file=sys.stderr)
        return EXIT_ERROR
    top = PrometheusTop(args.prometheus, run_id=args.run_id, job=args.job)
    interval = max(1.0, float(args.interval))

    def lines() -> list[str]:
        try:
            run_id = top.resolve_run()
            if run_id is None:
                return [f"traceml top: no live run of job {strip_control(args.job)} in {args.prometheus}"]
            return render(top.refresh(run_id), k=args.k)
        except (OSError, RuntimeError, ValueError) as error:  # keep refreshing: the server may come back
            return [f"traceml top: {args.prometheus}: {strip_control(str(error))[:300]}"]

    if args.once or not sys.stdout.isatty():
        while True:
            print("\n".join(lines()), flush=True)
            if args.once:
                return 0
            time.sleep(interval)
    from rich.live import Live
    from rich.text import Text

    with Live(Text("\n".join(lines())), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(Text("\n".join(lines())), refresh=True)
        except KeyboardInterrupt:
            return 0
