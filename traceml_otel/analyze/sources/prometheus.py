"""A run's metric totals from a Prometheus-compatible engine, aggregated by the engine (PromQL).

Only the Prometheus HTTP API is spoken (``/api/v1/query``, ``/api/v1/query_range``,
``/api/v1/query_exemplars``), so Mimir, Thanos and VictoriaMetrics answer too. Every query asks
for one number per rank (or per rank and phase, or per rank and collective source) or for one
series over the run: the answer's size grows with ranks, never with steps.

Totals over the range are exact differences of the cumulative series (the last value at
``--until`` minus the last value at ``--since``, or 0 when the run began after it), never
``increase()``, whose extrapolation at a run's edges is off by up to a scrape interval of steps.
``max by`` over the rank's labels merges copies of one series (an HA pair behind one query API).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from traceml_otel import contract as c
from traceml_otel.analyze.sources.base import ReadLog, SourceError
from traceml_otel.analyze.sources.dropped import DroppedSeries, rank_problem, value_problem
from traceml_otel.analyze.sources.http import ReadLimits, get_documents, shown_url
from traceml_otel.analyze.sources.prometheus_ends import RunEnds, no_such_run, read_ends
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.sanitize import strip_control
from traceml_otel.wire.metric_labels import KIND_LABEL, PHASE_LABEL, RANK_LABEL, RUN_LABEL, SOURCE_LABEL

STEP_SUM, STEP_COUNT = "traceml_step_duration_seconds_sum", "traceml_step_duration_seconds_count"
WAIT_SUM, WAIT_COUNT = "traceml_step_input_wait_seconds_sum", "traceml_step_input_wait_seconds_count"
PHASE_SUM, PHASE_COUNT = "traceml_phase_duration_seconds_sum", "traceml_phase_duration_seconds_count"
EXPOSED_SUM = "traceml_collective_exposed_seconds_sum"
COLLECTIVE_SUM = "traceml_collective_duration_seconds_sum"
CALLS, BYTES = "traceml_collective_calls_total", "traceml_collective_bytes_total"
SAMPLES, TOKENS = "traceml_samples_total", "traceml_tokens_total"
PEAK_ALLOCATED = "traceml_cuda_memory_peak_allocated_bytes"
PEAK_RESERVED = "traceml_cuda_memory_peak_reserved_bytes"
LAST_STEP = "traceml_step_last_timestamp_seconds"
STEP_BUCKET = "traceml_step_duration_seconds_bucket"
"""The Prometheus names of the contract's metrics (docs/telemetry.md); only ``_sum``/``_count`` of the
phase, input-wait and collective histograms are read (they carry no buckets)."""

MAX_POINTS = 400
LOOKBACK_S = 300.0
LOOKBACK = "300s"
"""How far back a query looks for a series' last sample (Prometheus' default staleness lookback)."""
"""Points of the over-the-run series (drift, memory): the bucket is the run's length / this."""
MAX_RANKS = 100_000
"""Series one per-rank answer may hold before it is refused (a selector that matched far too much)."""
MAX_RANK = 10_000_000
MAX_STEPS = 1e12
"""More steps than this on one rank is not a training run's counter: the answer is refused."""


@dataclass(frozen=True, slots=True)
class RankCounters:
    """One rank's totals over the range, as the engine summed them (seconds, counts)."""

    rank: int
    steps: float
    traced: float
    input_wait: float | None = None
    input_wait_steps: float = 0.0
    phase_time: tuple[float, ...] = (0.0,) * len(c.PHASES)
    phase_calls: tuple[float, ...] = (0.0,) * len(c.PHASES)
    exposed_by_source: tuple[tuple[str, float], ...] = ()
    collective_time: float | None = None
    collective_sources: tuple[str, ...] = ()
    """Collective sources (``ddp``, ``api``) timed on this rank."""
    collective_calls: float | None = None
    collective_bytes: float | None = None
    """Collective calls and their payload bytes (``None`` without the counters: an older emitter)."""
    samples: float | None = None
    tokens: float | None = None
    peak_allocated: float | None = None
    peak_reserved: float | None = None
    between_steps: float | None = None
    """Time between steps summed over ``between_steps_counted`` steps: the wall time from the end of
    the first step seen in the range to the end of the last, less the traced time of the steps
    between (:meth:`PrometheusReader.between_steps`); ``None`` without two scrapes of the run."""
    between_steps_counted: float = 0.0


@dataclass(frozen=True, slots=True)
class RunExtent:
    """The part of the asked range where the run has samples (unix seconds)."""

    start: float
    end: float
    """Totals are read here (the last point with a sample in the lookback before it)."""
    since_offset_s: float
    """From ``--since`` to ``end``: the start values of the totals are read that much earlier."""


@dataclass(frozen=True, slots=True)
class SlowExemplar:
    """A sampled step-duration observation with the trace it points at."""

    rank: int | None
    seconds: float
    trace_id: str


@dataclass(frozen=True, slots=True)
class MetricRun:
    """What the engine answered about one run."""

    run_id: str
    source: str
    ranks: tuple[RankCounters, ...]
    step_points: tuple[int, ...] = ()
    """Median steps done by each point of the over-the-run series (the drift's step axis)."""
    step_time_series: tuple[float, ...] = ()
    """Median over ranks of the mean step time (traced + input wait) in each bucket."""
    memory_worst: tuple[float, ...] = ()
    memory_median: tuple[float, ...] = ()
    bucket_s: float = 0.0
    exemplars: tuple[SlowExemplar, ...] = ()
    exemplars_queried: bool = False
    queries: int = 0
    warnings: tuple[str, ...] = ()
    """What the engine warned about (a partial answer) and what could not be read."""
    ends: RunEnds = field(default_factory=RunEnds)
    """How the run ended: exits, the hang watchdog's report, vanished ranks, the world size."""


def promql_string(value: str) -> str:
    """A PromQL string literal (Go escapes; a JSON string is one)."""
    return json.dumps(value)


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


class PrometheusReader:
    """Reads one run's totals from a Prometheus-compatible HTTP API.

    Args:
        url: the query API's base, e.g. ``http://prometheus:9090`` (Mimir: ``.../prometheus``).
        run_id: the run (label ``traceml_run_id``); required.
        when: the range; totals cover steps done in it.
    """

    def __init__(
        self, url: str, *, run_id: str, when: TimeRange, timeout: float = 30.0,
        limits: ReadLimits | None = None, log: ReadLog | None = None,
    ) -> None:
        if not run_id:
            raise SourceError("--prometheus needs --run-id (the traceml_run_id label of the run)")
        self.url = shown_url(url)
        self.run_id = run_id
        self.when = when
        self.timeout = timeout
        self.limits = limits if limits is not None else ReadLimits(timeout=timeout)
        self.log = log if log is not None else ReadLog()
        self.queries = 0
        self.dropped = DroppedSeries()
        """Series and samples left out of the answers, by reason: said in the report."""

    def describe(self) -> str:
        return f"Prometheus {self.url}"

    # --- PromQL building ---------------------------------------------------------------
    def selector(self, metric: str) -> str:
        return f"{metric}{{{RUN_LABEL}={promql_string(self.run_id)}}}"

    def total(self, metric: str, by: tuple[str, ...] = (), since_offset_s: float = 0.0) -> str:
        """Per rank (and ``by``): the series' last value at the query time minus its last value
        ``since_offset_s`` earlier (none then: 0). Each side reads one lookback window, not the run."""
        labels = ", ".join((RANK_LABEL, *by))
        end = f"max by ({labels}) (last_over_time({self.selector(metric)}[{LOOKBACK}]))"
        if since_offset_s < 0.001:
            return end
        offset = f"{round(since_offset_s * 1000)}ms"
        start = f"max by ({labels}) (last_over_time({self.selector(metric)}[{LOOKBACK}] offset {offset}))"
        return f"{end} - ({start} or {end} * 0)"

    def delta(self, metric: str, bucket: str) -> str:
        """Per rank: how much a cumulative series grew over the last ``bucket``."""
        now = f"max by ({RANK_LABEL}) (last_over_time({self.selector(metric)}[{bucket}]))"
        before = f"max by ({RANK_LABEL}) (last_over_time({self.selector(metric)}[{bucket}] offset {bucket}))"
        return f"({now} - {before})"

    # --- reading -------------------------------------------------------------------------
    def extent(self) -> RunExtent | None:
        """Where in the range the run has samples (one coarse range query), or ``None``."""
        step = float(max(1, math.ceil((self.when.end - self.when.start) / MAX_POINTS)))
        alive = f"max(last_over_time({self.selector(STEP_COUNT)}[{LOOKBACK}]))"
        times, _ = self._range(alive, self.when.start, self.when.end, step)
        if not times:
            return None
        start = max(self.when.start, times[0] - LOOKBACK_S)
        return RunExtent(start, times[-1], times[-1] - self.when.start)

    def read(self) -> MetricRun:
        """Every total and series of the run. Raises :class:`SourceError`."""
        extent = self.extent()
        if extent is None:
            return MetricRun(self.run_id, self.describe(), (), queries=self.queries,
                             warnings=no_such_run(self))
        at, since = extent.end, extent.since_offset_s

        def vector(metric: str) -> dict[int, float]:
            return self.vector_query(self.total(metric, since_offset_s=since), at)

        def by_source(metric: str) -> dict[tuple[int, str], float]:
            """Per rank and source, summed over kinds (``max by`` inside merges copies of one series)."""
            per_kind = self.total(metric, (SOURCE_LABEL, KIND_LABEL), since)
            return self._by_label(f"sum by ({RANK_LABEL}, {SOURCE_LABEL}) ({per_kind})", SOURCE_LABEL, at)

        def summed(metric: str) -> dict[int, float]:
            per_kind = self.total(metric, (SOURCE_LABEL, KIND_LABEL), since)
            return self.vector_query(f"sum by ({RANK_LABEL}) ({per_kind})", at)

        def by_label(metric: str, label: str) -> dict[tuple[int, str], float]:
            return self._by_label(self.total(metric, (label,), since), label, at)

        by_rank = vector(STEP_COUNT)
        if any(steps > MAX_STEPS for steps in by_rank.values()):
            raise SourceError(f"Prometheus at {self.url} answered an implausible step count "
                              f"({max(by_rank.values()):.3g} steps on one rank)")
        if not by_rank:
            self._say_dropped()
            return MetricRun(self.run_id, self.describe(), (), queries=self.queries,
                             warnings=tuple(self.log.warnings))
        traced, wait, wait_steps = vector(STEP_SUM), vector(WAIT_SUM), vector(WAIT_COUNT)
        phase_time, phase_calls = by_label(PHASE_SUM, PHASE_LABEL), by_label(PHASE_COUNT, PHASE_LABEL)
        exposed, collective = by_source(EXPOSED_SUM), by_source(COLLECTIVE_SUM)
        calls, nbytes = summed(CALLS), summed(BYTES)
        samples, tokens = vector(SAMPLES), vector(TOKENS)
        span = _duration(extent.end - extent.start)
        peaks = [
            self.vector_query(f"max by ({RANK_LABEL}) (max_over_time({self.selector(name)}[{span}]))", at)
            for name in (PEAK_ALLOCATED, PEAK_RESERVED)
        ]
        ranks = tuple(
            RankCounters(
                rank=rank,
                steps=steps,
                traced=traced.get(rank, 0.0),
                input_wait=wait.get(rank),
                input_wait_steps=wait_steps.get(rank, 0.0),
                phase_time=tuple(phase_time.get((rank, p), 0.0) for p in c.PHASES),
                phase_calls=tuple(phase_calls.get((rank, p), 0.0) for p in c.PHASES),
                exposed_by_source=tuple(sorted((s, v) for (r, s), v in exposed.items() if r == rank)),
                collective_time=_total(v for (r, _), v in collective.items() if r == rank),
                collective_sources=tuple(sorted({s for r, s in collective if r == rank})),
                collective_calls=calls.get(rank),
                collective_bytes=nbytes.get(rank),
                samples=samples.get(rank),
                tokens=tokens.get(rank),
                peak_allocated=peaks[0].get(rank),
                peak_reserved=peaks[1].get(rank),
            )
            for rank, steps in sorted(by_rank.items())
            if steps > 0
        )
        between, counted = self.between_steps(span, at)
        ranks = tuple(
            replace(r, between_steps=between.get(r.rank), between_steps_counted=counted.get(r.rank, 0.0))
            for r in ranks
        )
        series = self._over_the_run(extent)
        exemplars, queried = self._exemplars(extent)
        self._say_dropped()
        ends = read_ends(self, _duration(extent.end - extent.start + LOOKBACK_S), LOOKBACK, at)
        return MetricRun(
            self.run_id, self.describe(), ranks, *series, exemplars=exemplars, exemplars_queried=queried,
            queries=self.queries, warnings=tuple(self.log.warnings), ends=ends,
        )


    def between_steps(self, span: str, at: float) -> tuple[dict[int, float], dict[int, float]]:
        """Per rank: the time between steps summed over the steps ended in the range, and how many.

        The wall time from the end of the first step a scrape saw in the range (``min_over_time`` of
        the last-step time: it only grows) to the end of the last, less the traced time of the
        steps ended in between, is the time between those steps (input wait, loading, logging, and
        ``outside_step`` blocks, which the span attribute leaves out). Its clock is wall time.
        """
        counted = {r: n for r, n in self.vector_query(self._grown(STEP_COUNT, span), at).items() if n >= 1}
        wall = self.vector_query(f"{self._grown(LAST_STEP, span)} - {self._grown(STEP_SUM, span)}", at)
        return {r: max(0.0, v) for r, v in wall.items() if r in counted}, counted

    def _grown(self, metric: str, span: str, *by: str) -> str:
        """Per rank (and ``by``): the last value less the first one a scrape saw in ``span`` (the series
        only grow over a run)."""
        labels = ", ".join((RANK_LABEL, *by))
        last = f"max by ({labels}) (last_over_time({self.selector(metric)}[{LOOKBACK}]))"
        first = f"max by ({labels}) (min_over_time({self.selector(metric)}[{span}]))"
        return f"({last} - {first})"

    def _over_the_run(self, extent: RunExtent) -> tuple[
        tuple[int, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...], float
    ]:
        """Drift and memory series: one point per bucket of the run's steps, medians over ranks."""
        last = self.selector(LAST_STEP)
        spacing = (f"max((max_over_time({last}[{LOOKBACK}]) - min_over_time({last}[{LOOKBACK}])) "
                   f"/ (count_over_time({last}[{LOOKBACK}]) - 1 > 0))")
        interval = self.scalar_query(spacing, extent.end)
        if not interval or interval <= 0:
            return (), (), (), (), 0.0
        start, end = extent.start, extent.end
        bucket_s = float(max(1, math.ceil(max(1.5 * interval, (end - start) / MAX_POINTS))))
        bucket = _duration(bucket_s)
        wait = self.delta(WAIT_SUM, bucket)
        traced = self.delta(STEP_SUM, bucket)
        per_rank = f"({traced} + ({wait} or {traced} * 0)) / ({self.delta(STEP_COUNT, bucket)} > 0)"
        times, series = self._range(f"quantile(0.5, {per_rank})", start, end, bucket_s)
        done = dict(zip(*self._range(
            f"quantile(0.5, max by ({RANK_LABEL}) (last_over_time({self.selector(STEP_COUNT)}[{bucket}])))",
            start, end, bucket_s), strict=True))
        points = tuple(int(done.get(t, 0.0)) for t in times)
        peak = f"max by ({RANK_LABEL}) (max_over_time({self.selector(PEAK_ALLOCATED)}[{bucket}]))"
        worst = tuple(self._range(f"max({peak})", start, end, bucket_s)[1])
        median = tuple(self._range(f"quantile(0.5, {peak})", start, end, bucket_s)[1])
        return points, tuple(series), worst, median, bucket_s

    def _exemplars(self, extent: RunExtent) -> tuple[tuple[SlowExemplar, ...], bool]:
        """The slowest step-duration exemplars (empty when the engine keeps none)."""
        params = {"query": self.selector(STEP_BUCKET), "start": f"{extent.start:.3f}",
                  "end": f"{extent.end:.3f}"}
        try:
            data = self.api_data("/api/v1/query_exemplars", params)
        except SourceError as error:
            self.log.warn(f"exemplars not read ({error}); the slowest steps' trace ids are not available")
            return (), False
        found: list[SlowExemplar] = []
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("exemplars"), list):
                continue
            labels = entry.get("seriesLabels")
            rank = _rank(labels.get(RANK_LABEL)) if isinstance(labels, dict) else None
            for exemplar in entry["exemplars"][:10_000]:
                if not isinstance(exemplar, dict) or not isinstance(exemplar.get("labels"), dict):
                    continue
                trace_id = exemplar["labels"].get("trace_id")
                value = _number(exemplar.get("value"))
                if isinstance(trace_id, str) and value is not None and len(trace_id) <= 64:
                    found.append(SlowExemplar(rank, value, strip_control(trace_id)))
        found.sort(key=lambda e: -e.seconds)
        return tuple(found[:5]), True

    # --- the HTTP API ----------------------------------------------------------------------
    def api_data(self, path: str, params: Mapping[str, object]) -> object:
        self.queries += 1
        documents = get_documents(self.url, path, params, what="Prometheus", timeout=self.timeout,
                                  limits=self.limits)
        answer = documents[0] if len(documents) == 1 else None
        if not isinstance(answer, dict):
            raise SourceError(f"Prometheus at {self.url} answered something that is not a Prometheus API "
                              "answer")
        if answer.get("status") != "success":
            error = _printable(answer.get("error", "no error text"))
            raise SourceError(f"Prometheus at {self.url} refused the query: {error}")
        for warning in (answer.get("warnings") or [])[:5] if isinstance(answer.get("warnings"), list) else []:
            self.log.warn(f"Prometheus: {_printable(warning)}")
        return answer.get("data")

    def _result(self, path: str, params: Mapping[str, object], kind: str) -> list[dict]:
        data = self.api_data(path, params)
        shape_ok = isinstance(data, dict) and data.get("resultType") == kind
        if not shape_ok or not isinstance(data.get("result"), list):
            raise SourceError(f"Prometheus at {self.url} answered a query with no {kind} result")
        result = data["result"]
        if len(result) > MAX_RANKS:
            raise SourceError(f"Prometheus answered {len(result):,} series for one query (more than "
                              f"{MAX_RANKS:,}); is --run-id right?")
        return [item for item in result if isinstance(item, dict) and isinstance(item.get("metric"), dict)]

    def instant_query(self, query: str, at: float) -> list[dict]:
        return self._result("/api/v1/query", {"query": query, "time": f"{at:.3f}"}, "vector")

    def vector_query(self, query: str, at: float) -> dict[int, float]:
        """``{rank: value}`` of a per-rank instant query (non-finite and unlabelled values dropped)."""
        values: dict[int, float] = {}
        for item in self.instant_query(query, at):
            rank, value = _rank(item["metric"].get(RANK_LABEL)), _sample(item.get("value"))
            if rank is not None and value is not None:
                values[rank] = value
            else:
                self._drop(item["metric"].get(RANK_LABEL), item.get("value"))
        return values

    def _say_dropped(self) -> None:
        for line in self.dropped.lines(RANK_LABEL):
            self.log.warn(line)

    def _drop(self, rank: object, pair: object) -> None:
        reason = rank_problem(rank, MAX_RANK) if _rank(rank) is None else value_problem(pair)
        self.dropped.add_series(reason, rank)

    def _by_label(self, query: str, label: str, at: float) -> dict[tuple[int, str], float]:
        values: dict[tuple[int, str], float] = {}
        for item in self.instant_query(query, at):
            rank, value = _rank(item["metric"].get(RANK_LABEL)), _sample(item.get("value"))
            name = item["metric"].get(label)
            if rank is not None and value is not None and isinstance(name, str):
                values[(rank, strip_control(name)[:64])] = value
            elif rank is None or value is None:
                self._drop(item["metric"].get(RANK_LABEL), item.get("value"))
        return values

    def scalar_query(self, query: str, at: float) -> float | None:
        found = [_sample(item.get("value")) for item in self.instant_query(query, at)]
        return next((v for v in found if v is not None), None)

    def _range(self, query: str, start: float, end: float, step: float) -> tuple[list[float], list[float]]:
        """Timestamps and values of a one-series range query (empty when it has none)."""
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        result = self._result("/api/v1/query_range", params, "matrix")
        if not result or not isinstance(result[0].get("values"), list):
            return [], []
        times, values = [], []
        for pair in result[0]["values"][: MAX_POINTS * 4]:
            value = _sample(pair)
            if value is not None:
                times.append(float(pair[0]))
                values.append(value)
            else:
                self.dropped.add_sample(value_problem(pair))
        return times, values


def _total(values: Iterable[float]) -> float | None:
    """The sum of ``values``; ``None`` when there are none (not measured is not 0)."""
    found = list(values)
    return sum(found) if found else None


def _number(raw: object) -> float | None:
    """A finite float from Prometheus' string form (``"1.5"``); ``None`` for anything else."""
    if not isinstance(raw, str | int | float) or isinstance(raw, bool) or len(str(raw)) > 40:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _sample(pair: object) -> float | None:
    """The value of a ``[timestamp, "value"]`` pair."""
    if not isinstance(pair, list) or len(pair) != 2 or _number(pair[0]) is None:
        return None
    return _number(pair[1])


def _rank(raw: object) -> int | None:
    if not isinstance(raw, str) or not raw.isascii() or not raw.isdigit() or len(raw) > 8:
        return None
    rank = int(raw)
    return rank if rank <= MAX_RANK else None


def _printable(value: object, limit: int = 200) -> str:
    text = " ".join(strip_control(str(value)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
