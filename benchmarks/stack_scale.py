"""Scale of the rendered stack at N ranks: series, rule evaluation time, and what every dashboard query reads.

N simulated ranks serve the project's real exposition: each rank is the emitter's own
``PrometheusStepMetrics`` registry (prometheus-client; the metric code the direct scrape endpoint
runs), filled every simulated scrape interval with plausible steps (4 phases, input wait, one DDP
all-reduce, CUDA memory; a few slow ranks). A handful of processes host all ranks, each serving its
ranks' registries on one endpoint, so 1,024 ranks fit on 2 cores. A real Prometheus scrapes them
and evaluates the rendered rules.

Time is compressed 15x, so a run of a few minutes has the shape of an hour: Prometheus scrapes and
evaluates every 1 s (a 15 s interval in production), the rules are the `--profile short` render
(its 20 s rate window is production's 5 m / 15), and every dashboard query is run as Grafana would
for a 1 h view at a 15 s step: a range of 240 points, 1 s apart, `$__rate_interval` = 4 s (4
intervals). Samples read (`stats=all`, totalQueryableSamples), lines returned and points per line
are the same as for the real hour; wall times are of this machine.

Compressed, every rule group is evaluated 15 times as often as in production, so on a small machine the
groups queue behind each other and the simulation. The rule groups' evaluation times that answer "does
one evaluation fit its interval" are therefore taken after the compressed hour: Prometheus reloads with
production's 15 s evaluation interval (scrapes stay at 1 s; the recorded data and every window stay
as they were) and, one interval later, each group is watched for six evaluations. ``--isolated``
then evaluates each rule alone: the work itself, without any queue.

    python benchmarks/stack_scale.py --ranks 256 --ranks 1024          # prints a Markdown table
    python benchmarks/stack_scale.py --ranks 64 --seconds 60             # a quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ports import free_port
from tests.prometheus_server import serve_exposition, start_prometheus, static_targets
from traceml_otel.emit.step_metrics import CollectiveSample, LiveState, PrometheusStepMetrics, RankLabels
from traceml_otel.stack import StackConfig, Windows, render_all, write_files
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.time_record import FlopsRecord, OutsideTotal, TimeRecord

RUN_ID, JOB = "sim-run", "sim-job"
POINTS = 240
"""A 1 h view at a 15 s step."""
SAMPLED_S = 20.0
"""The rule groups' evaluation times are sampled over the run's last 20 s."""
PRODUCTION_INTERVAL_S = 15
"""The evaluation interval the rules are rendered for (production's default)."""
CADENCE_EVALUATIONS = 6
"""Evaluations of each group watched at the production interval."""
BUDGET_SAMPLES = 2_000_000
BUDGET_LINES = 20
ROUND_S = 2.0
PHASES = (("forward", 0.30), ("backward", 0.45), ("optimizer", 0.10), ("h2d", 0.02))


class _Ranks:
    """Some ranks' real registries, updated once per simulated interval, served on one endpoint."""

    def __init__(self, ranks: range, world: int, seed: int) -> None:
        self.metrics: list[PrometheusStepMetrics] = []
        self.states: list[LiveState] = []
        for rank in ranks:
            labels = RankLabels(RUN_ID, rank, rank % 8, f"node-{rank // 8}", "sim", job=JOB, world_size=world)
            state = LiveState(labels, lambda: 0)
            state.gpu_uuid, state.cuda_device = f"GPU-{rank:08x}", str(rank % 8)
            state.time.account.record = TimeRecord(  # the time record the emitter would read
                rank, RUN_ID, process_start=time.time() - 60, outside=(OutsideTotal("evaluation", 30.0, 1),),
                flops=FlopsRecord(declared_sum=4e14, declared_steps=1, peak_flops=989e12))
            self.states.append(state)
            self.metrics.append(PrometheusStepMetrics(None, state))
        self.random = random.Random(seed)
        self.slow = {r for r in ranks if r % 97 == 13}  # a few stragglers
        self.lock = threading.Lock()

    def step_all(self, steps: int) -> None:
        with self.lock:
            for state, metrics in zip(self.states, self.metrics, strict=True):
                base = 0.5 * (1.3 if state.labels.rank in self.slow else 1.0)
                for _ in range(steps):
                    step = base * self.random.uniform(0.95, 1.05)
                    wait = 0.02 * self.random.uniform(0.5, 1.5)
                    memory = (30 << 30, (34 << 30) + self.random.randint(0, 1 << 28))
                    metrics.record(step, [(p, step * share) for p, share in PHASES], wait, memory)
                    metrics.record_work(32, 32 * 2048)
                    metrics.record_collectives([CollectiveSample("ddp", "all_reduce", step * 0.3, step * 0.05,
                                                               4, 100 << 20)])
                    state.last_step_end_s = end = time.time()
                    state.last_wait_s = wait
                    state.time.account.add_step(StepRecord(  # the time counters and MFU inputs
                        step=0, start_ns=int((end - step) * 1e9), end_ns=int(end * 1e9),
                        input_wait_ns=int(wait * 1e9), between_steps_ns=int((wait + 0.01) * 1e9)))

    def exposition(self) -> bytes:
        """Every rank's families merged by name (one HELP/TYPE per family), in the text format."""
        from prometheus_client.exposition import generate_latest

        with self.lock:
            merged: dict[str, Any] = {}
            for metrics in self.metrics:
                for family in metrics.registry.collect():
                    if family.name in merged:
                        merged[family.name].samples.extend(family.samples)
                    else:
                        merged[family.name] = family
            families = list(merged.values())

        class Merged:
            def collect(self) -> list[Any]:
                return families

        return generate_latest(Merged())  # type: ignore[arg-type]


def _serve(ranks: range, world: int, port: int, seed: int, ready: Any, round_s: Any = None) -> None:
    """One worker process: its ranks, two steps each per round, one endpoint.

    prometheus-client formats a few hundred ranks' registries in about a second, more than a 1 s
    scrape may take, so each round's exposition is cached and every scrape serves the latest one: a
    round's counters show up at the next scrape, and Prometheus ingests one sample per series per
    scrape either way (the samples every query reads are the same)."""
    group = _Ranks(ranks, world, seed)
    latest = [b""]

    def refresh() -> None:
        group.step_all(2)
        latest[0] = group.exposition()

    refresh()
    serve_exposition(lambda: latest[0], port)
    ready.set()
    while True:  # a round at most every 2 s: the shape of the values, not their count, matters here
        started = time.monotonic()
        refresh()
        every = ROUND_S if round_s is None else round_s.value  # a shared value the benchmark may raise
        time.sleep(max(0.0, every - (time.monotonic() - started)))


@dataclass
class QueryCost:
    panel: str
    expr: str
    samples: int
    wall_s: float
    lines: int


def _api(url: str, path: str, **params: str) -> Any:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=120) as reply:
        body = json.load(reply)
    if body.get("status") != "success":
        raise RuntimeError(body)
    return body["data"]


def _group_times(url: str, seconds: float) -> dict[str, list[float]]:
    """Each group's evaluation times over ``seconds``, smallest first (see :func:`_evaluations`)."""
    return {name: sorted(times for _, times in seen) for name, seen in _evaluations(url, seconds).items()}


def _evaluations(url: str, seconds: float) -> dict[str, list[tuple[str, float]]]:
    """Each group's evaluations over ``seconds`` as (start, seconds), in time order (the rules API
    polled every 0.5 s; an evaluation counted once, by its start): one snapshot of the last evaluation
    is noisy on a shared machine."""
    seen: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for group in _api(url, "rules")["groups"]:
            seen.setdefault(group["name"], {})[group["lastEvaluation"]] = group["evaluationTime"]
        time.sleep(0.5)
    return {name: sorted(times.items()) for name, times in seen.items()}


def _missed(url: str) -> dict[str, int]:
    """Iterations each group missed since the start (``prometheus_rule_group_iterations_missed_total``:
    an evaluation longer than the interval skips the next)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    missed = {}
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_iterations_missed_total{"):
            labels, value = line.rsplit(" ", 1)
            name = labels.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
            missed[name] = int(float(value))
    return missed


def _at_production_interval(server: Any, round_s: Any, seconds: float) -> dict[str, list[tuple[str, float]]]:
    """Each group's evaluation times after Prometheus reloads its configuration with the production
    evaluation interval (scrapes stay at 1 s).

    The compressed run evaluates every group every second: 15 times production's rate, so on 2 cores
    every group overlaps every other and the simulation, and an evaluation's wall time measures the
    queue, not the rule. Reloading keeps the data the compressed run recorded (1 s apart, the density
    production's 15 s evaluations give its 1h windows) and the short profile's windows (a 5m rate reads
    20 samples, as in production), so each evaluation reads what a production evaluation reads, at
    production's rate; Prometheus spreads the groups over the interval as it does in production. The
    simulated ranks then refresh once an interval instead of every 2 s: formatting their expositions
    takes most of the 2 cores, CPU that in production is the training nodes', not the Prometheus
    host's (scrapes still read 20 samples a 5m window: each serves the latest exposition)."""
    import signal

    import yaml

    config_path = server.log.parent / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    config["global"]["evaluation_interval"] = f"{PRODUCTION_INTERVAL_S}s"
    config_path.write_text(yaml.safe_dump(config))
    server.proc.send_signal(signal.SIGHUP)
    round_s.value = float(PRODUCTION_INTERVAL_S)
    time.sleep(PRODUCTION_INTERVAL_S + 5)  # the compressed run's last evaluations finish, unmeasured
    return _evaluations(server.url, seconds)


def _isolated(url: str, files: dict[str, str], at: float) -> dict[str, list[tuple[float, str]]]:
    """Each rule's expression evaluated alone at ``at`` on a Prometheus that scrapes and evaluates
    nothing else (the same data): the engine's evaluation time, the least of 3 tries, per group. The
    work each evaluation costs, apart from the simulation's and the other groups' load on the cores."""
    import yaml

    work: dict[str, list[tuple[float, str]]] = {}
    for path in ("prometheus/recording.yml", "prometheus/alerts.yml"):
        for group in yaml.safe_load(files[path])["groups"]:
            for rule in group["rules"]:
                best = min(_api(url, "query", query=rule["expr"], time=f"{at:.3f}", stats="all")
                           ["stats"]["timings"]["evalTotalTime"] for _ in range(3))
                work.setdefault(group["name"], []).append((best, rule.get("record") or rule["alert"]))
    return work


def _dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(panel [refId], PromQL as Grafana sends it for a 1 h view, instant?) of every Prometheus target."""
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if "expr" in target:
                expr = (target["expr"].replace("$__rate_interval", "4s").replace("$__range", "240s")
                        .replace("$run_id", RUN_ID)
                        .replace("$job", JOB).replace("$rank", "0"))
                queries.append((f"{panel['title']} [{target['refId']}]", expr, bool(target.get("instant"))))
    return queries


def _raise_priority(pids: list[int], niceness: int) -> None:
    """Give Prometheus and the simulated ranks ``niceness`` (``--nice``; negative needs root), so other
    work on a shared machine does not take their cores: a stand-in for a Prometheus host of its own."""
    for pid in pids:  # every thread (Linux's niceness is a thread's; new threads inherit it)
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


def measure(ranks: int, seconds: float, workers: int, isolated: bool = False,
            niceness: int | None = None) -> dict[str, Any]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="stack-scale-"))
    files = render_all(StackConfig(windows=Windows.short()))
    write_files(files, tmp)
    dashboard = json.loads(files["grafana/dashboards/traceml-training.json"])
    ports = [free_port() for _ in range(workers)]
    context = multiprocessing.get_context("spawn")
    procs = []
    round_s = context.Value("d", ROUND_S)
    per = -(-ranks // workers)
    for index, port in enumerate(ports):
        ready = context.Event()
        proc = context.Process(target=_serve, args=(range(index * per, min(ranks, (index + 1) * per)), ranks,
                                                    port, index, ready, round_s), daemon=True)
        proc.start()
        ready.wait(120)
        procs.append(proc)
    server = start_prometheus(tmp / "server", [static_targets("traceml", [f"127.0.0.1:{p}" for p in ports])],
                              rules_dir=tmp / "prometheus", flags=["--query.max-samples=200000000"],
                              port=free_port(avoid=tuple(ports)))
    url = server.url
    if niceness is not None:
        _raise_priority([server.proc.pid, *(proc.pid for proc in procs if proc.pid is not None)], niceness)
    try:
        time.sleep(max(0.0, seconds - SAMPLED_S))
        spread = _group_times(url, SAMPLED_S)
        end = time.time()
        start = end - POINTS
        counted = _api(url, "query", query='count({__name__=~"traceml_.*"})')["result"]
        series = int(float(counted[0]["value"][1]))
        groups = _api(url, "rules")["groups"]
        evaluation = {g["name"]: g["evaluationTime"] for g in groups}
        timed = ((r.get("evaluationTime", 0.0), r.get("name", "")) for g in groups for r in g["rules"])
        rules = sorted(timed, reverse=True)[:8]
        steps_rate = f'run:traceml_steps:rate{{traceml_run_id="{RUN_ID}"}}'
        recorded = _api(url, "query", query=f"count_over_time({steps_rate}[{POINTS}s])")["result"]
        evaluations = int(float(recorded[0]["value"][1])) if recorded else 0
        failed = _api(url, "query", query=f"sum(count_over_time((up == 0)[{POINTS}s:1s]))")["result"]
        scrape = _api(url, "query", query="max(scrape_duration_seconds)")["result"]
        costs = []
        for panel, expr, instant in _dashboard_queries(dashboard):
            began = time.monotonic()
            if instant:  # bar gauges: one evaluation at the end of the range
                data = _api(url, "query", query=expr, time=f"{end:.3f}", stats="all")
            else:
                data = _api(url, "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1",
                            stats="all")
            wall = time.monotonic() - began
            samples = int(data.get("stats", {}).get("samples", {}).get("totalQueryableSamples", -1))
            costs.append(QueryCost(panel, expr, samples, wall, len(data["result"])))
        cadence = _at_production_interval(server, round_s, CADENCE_EVALUATIONS * PRODUCTION_INTERVAL_S + 2)
        result = {"evaluations": evaluations,
                  "failed_scrapes": float(failed[0]["value"][1]) if failed else 0.0,
                  "ranks": ranks, "series": series, "series_per_rank": series / ranks,
                  "evaluation": evaluation,
                  "scrape_s": float(scrape[0]["value"][1]) if scrape else None, "queries": costs,
                  "slowest_rules": rules, "spread": spread, "missed": _missed(url), "isolated": {},
                  "cadence": cadence}
        if isolated:  # the same data on a Prometheus that does nothing else
            for proc in procs:
                proc.kill()
            server.stop()
            server = start_prometheus(tmp / "server", [], flags=["--query.max-samples=200000000"],
                                      port=free_port(avoid=tuple(ports))).wait_ready(120)
            result["isolated"] = _isolated(server.url, files, end - 1)
        return result
    finally:
        server.stop()
        for proc in procs:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _table(results: list[dict[str, Any]]) -> str:
    sizes = [r["ranks"] for r in results]
    lines = ["| ranks | series (traceml_*) | per rank | rule groups' last evaluation (s) | evaluations in "
             f"{POINTS} s | slowest scrape (s) | failed scrapes |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        evaluation = ", ".join(f"{name} {t:.3f}" for name, t in r["evaluation"].items())
        lines.append(f"| {r['ranks']} | {r['series']} | {r['series_per_rank']:.1f} | {evaluation} | "
                     f"{r['evaluations']} | {r['scrape_s']:.2f} | {r['failed_scrapes']:.0f} |")
    for r in results:
        lines += ["", f"Slowest rules at {r['ranks']} ranks (last evaluation, s): "
                  + ", ".join(f"{name} {seconds:.3f}" for seconds, name in r["slowest_rules"])]
        lines += ["", f"Rule groups at {r['ranks']} ranks over the last {SAMPLED_S:.0f} s (evaluations seen, "
                  "median / max s, iterations missed since the start): "
                  + ", ".join(f"{name} {len(t)}, {t[len(t) // 2]:.3f} / {t[-1]:.3f}, "
                              f"{r['missed'].get(name, 0)}" for name, t in r["spread"].items() if t)]
    for r in results:
        cadence = {name: sorted(t for _, t in seen) for name, seen in r["cadence"].items() if seen}
        if cadence:
            slowest = max(cadence, key=lambda name: cadence[name][-1])
            groups = ", ".join(f"{name} {len(t)}, {t[len(t) // 2]:.3f} / {t[-1]:.3f}"
                               for name, t in cadence.items())
            in_order = " ".join(f"{t:.2f}" for _, t in r["cadence"][slowest])
            lines += ["", f"Rule groups at {r['ranks']} ranks at the production interval "
                      f"({PRODUCTION_INTERVAL_S} s, after the reload; evaluations seen, median / max s): "
                      + groups
                      + f"; slowest evaluation {cadence[slowest][-1]:.3f} s ({slowest}, "
                      f"{100 * cadence[slowest][-1] / PRODUCTION_INTERVAL_S:.1f} % of the interval; its "
                      f"evaluations in time order: {in_order})"]
    for r in results:
        if r["isolated"]:
            work = r["isolated"]
            per_group = ", ".join(f"{name} {sum(t for t, _ in rules):.3f}" for name, rules in work.items())
            lines += ["", f"Each group's rules evaluated alone at {r['ranks']} ranks (s, a Prometheus "
                      "doing nothing else, the same data): " + per_group
                      + f"; all {sum(t for rules in work.values() for t, _ in rules):.3f}; slowest rules: "
                      + ", ".join(f"{name} {t:.3f}" for t, name in
                                  sorted((x for rules in work.values() for x in rules), reverse=True)[:6])]
    lines += ["", "| panel [query] | " + " | ".join(f"samples @{n} | lines @{n} | wall s @{n}" for n in sizes)
              + " | within budget |",
              "|---|" + "---|---|---|" * len(sizes) + "---|"]
    for index, cost in enumerate(results[0]["queries"]):
        row = [cost.panel.replace("|", "/")]
        inside = True
        for r in results:
            c = r["queries"][index]
            row += [f"{c.samples:,}", str(c.lines), f"{c.wall_s:.2f}"]
            inside = inside and c.samples <= BUDGET_SAMPLES and c.lines <= BUDGET_LINES
        lines.append("| " + " | ".join(row) + f" | {'yes' if inside else '**no**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, action="append", help="simulated ranks (repeatable; 256, 1024)")
    parser.add_argument("--seconds", type=float, default=POINTS + 25, help="simulated run before measuring")
    parser.add_argument("--workers", type=int, default=max(1, min(4, (os.cpu_count() or 2))),
                        help="processes hosting the ranks")
    parser.add_argument("--isolated", action="store_true",
                        help="then evaluate each rule alone on a Prometheus that does nothing else")
    parser.add_argument("--nice", type=int, default=None,
                        help="run Prometheus and the simulated ranks at this niceness (e.g. -10, as root) "
                             "on a machine shared with other work")
    args = parser.parse_args(argv)
    results = [measure(n, args.seconds, args.workers, args.isolated, args.nice)
               for n in (args.ranks or [256, 1024])]
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
