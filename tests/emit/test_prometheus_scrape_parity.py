"""The hand-aggregated scrape path serves what prometheus-client's own instruments served.

``_ClientInstruments`` is the scrape path as it was before the aggregation by hand (commit 0bcea07):
``Histogram``/``Summary``/``Counter`` fed per measurement. Both get the same measurements (phases and
collectives that appear late, unmeasured exposed times, zero calls, rejected durations, steps with
and without exemplars, no samples on some steps) and both registries are scraped in the text format
and in OpenMetrics at several points; the texts must be equal but for the exemplars' timestamps.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time

import pytest
from prometheus_client import Counter, Histogram, Summary, disable_created_metrics, enable_created_metrics
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics

from traceml_otel import contract as c
from traceml_otel.emit.prometheus_scrape import _LiveCollector
from traceml_otel.emit.step_metrics import CollectiveSample, LiveState, PrometheusStepMetrics, RankLabels

LABELS = ["traceml_job", "traceml_run_id", "traceml_rank"]
COLLECTIVE_LABELS = [*LABELS, "traceml_collective_source", "traceml_collective_kind"]


class _ClientInstruments(PrometheusStepMetrics):
    """The previous implementation: prometheus-client's instruments, then the live families."""

    def __init__(self, state: LiveState) -> None:
        super().__init__(None, state)
        from prometheus_client import CollectorRegistry

        self.registry = registry = CollectorRegistry()
        self._step_h = Histogram("traceml_step_duration_seconds", "Traced step time", LABELS,
                                 buckets=list(c.DURATION_BUCKETS_S), registry=registry)
        self._phase_s = Summary("traceml_phase_duration_seconds", "Phase call duration",
                                [*LABELS, "traceml_phase_name"], registry=registry)
        self._wait_s = Summary("traceml_step_input_wait_seconds", "Input wait before each step", LABELS,
                               registry=registry)
        self._coll_s = Summary("traceml_collective_duration_seconds", "Collective time per step",
                               COLLECTIVE_LABELS, registry=registry)
        self._exposed_s = Summary("traceml_collective_exposed_seconds", "Exposed collective time per step",
                                  COLLECTIVE_LABELS, registry=registry)
        self._calls_c = Counter("traceml_collective_calls", "Collective calls", COLLECTIVE_LABELS,
                                registry=registry)
        self._bytes_c = Counter("traceml_collective_bytes", "Collective payload bytes", COLLECTIVE_LABELS,
                                registry=registry)
        self._steps_c = Counter("traceml_steps", "Completed steps", LABELS, registry=registry)
        self._samples_c = Counter("traceml_samples", "Samples processed", LABELS, registry=registry)
        self._tokens_c = Counter("traceml_tokens", "Tokens processed", LABELS, registry=registry)
        registry.register(_LiveCollector(self))

    def record(self, step_s: float, phases: list[tuple[str, float]], wait_s: float | None,
               memory: tuple[int, int] | None, exemplar_ids: tuple[int, int] | None = None) -> None:
        labels = self._labels  # the ids were formatted by the caller then: here, as StepMetrics did
        exemplar = None if exemplar_ids is None else {"trace_id": f"{exemplar_ids[0]:032x}",
                                                      "span_id": f"{exemplar_ids[1]:016x}"}
        if self._valid(step_s):
            self._step_h.labels(**labels).observe(step_s, exemplar=exemplar)
        for phase, seconds in phases:
            if self._valid(seconds):
                self._phase_s.labels(**labels, traceml_phase_name=phase).observe(seconds)
        if wait_s is not None and self._valid(wait_s):
            self._wait_s.labels(**labels).observe(wait_s)
        self._steps_c.labels(**labels).inc()
        if memory is not None:
            self._allocated.update(memory[0])
            self._reserved.update(memory[1])

    def record_work(self, samples: int | None, tokens: int | None) -> None:
        if samples is not None:
            self._samples_c.labels(**self._labels).inc(samples)
        if tokens is not None:
            self._tokens_c.labels(**self._labels).inc(tokens)

    def record_collectives(self, collectives: list[CollectiveSample]) -> None:
        for one in collectives:
            labels = {**self._labels, "traceml_collective_source": one.source,
                      "traceml_collective_kind": one.kind}
            if one.seconds is not None and self._valid(one.seconds):
                self._coll_s.labels(**labels).observe(one.seconds)
            if one.exposed is not None and self._valid(one.exposed):
                self._exposed_s.labels(**labels).observe(one.exposed)
            self._calls_c.labels(**labels).inc(one.calls)
            self._bytes_c.labels(**labels).inc(one.nbytes)


@pytest.fixture
def no_created():
    disable_created_metrics()  # as the emitter ran the instruments
    yield
    enable_created_metrics()


_EXEMPLAR_TIME = re.compile(r"( # \{[^}]*\} \S+) (\d+(?:\.\d+)?)$", re.MULTILINE)


def _scrapes(metrics: PrometheusStepMetrics, since: float) -> tuple[str, str]:
    """Both formats; exemplar timestamps replaced by ``T`` once checked to be now-ish Unix times."""
    om = openmetrics.generate_latest(metrics.registry).decode()  # type: ignore[arg-type]
    for stamp in _EXEMPLAR_TIME.findall(om):
        assert since - 1 <= float(stamp[1]) <= time.time() + 1, stamp
    return text_format.generate_latest(metrics.registry).decode(), _EXEMPLAR_TIME.sub(r"\1 T", om)  # type: ignore[arg-type]


def _feed(targets: list[PrometheusStepMetrics], rng: random.Random, steps: int, first: int) -> None:
    bad = [math.nan, -0.001, math.inf]
    for n in range(first, first + steps):
        step_s = rng.choice(bad) if n % 37 == 5 else rng.lognormvariate(-4, 1.5)
        if n % 11 == 4:  # on a bucket boundary (it counts in the bucket it closes), 0, past the last one
            step_s = rng.choice([*c.DURATION_BUCKETS_S, 0.0, 100.0])
        names = ["forward", "backward", "optimizer"] + (["h2d"] if n >= 40 else [])
        phases = [(name, rng.choice(bad) if n % 53 == 7 else rng.uniform(0, 0.5)) for name in names]
        wait = None if n % 4 == 3 else rng.uniform(0, 0.01)
        memory = (rng.randint(1, 1 << 30), rng.randint(1 << 30, 1 << 31)) if n % 2 else None
        ids = None if n % 3 == 2 else (rng.getrandbits(128), rng.getrandbits(64))
        samples = None if n < 10 else rng.randint(1, 64)
        tokens = None if n < 20 else rng.randint(0, 1 << 40)
        exposed = None if n < 30 else rng.uniform(0, 0.002)
        collectives = [CollectiveSample("ddp", "all_reduce", rng.uniform(0, 0.01), exposed, 2,
                                        rng.randint(0, 1 << 28))]
        if n >= 25:
            collectives.insert(0, CollectiveSample("api", "barrier", rng.choice([0.0, math.nan, 0.001]),
                                                   rng.uniform(0, 0.001), 0 if n % 2 else 1, 0))
        for target in targets:
            target.record(step_s, phases, wait, memory, ids)
            target.record_work(samples, tokens)
            target.record_collectives(collectives)


def test_the_exposition_is_the_one_prometheus_clients_instruments_served(no_created: None) -> None:
    state = LiveState(RankLabels("run-parity", 5, 1, "host-a", "0.1", job="job-x"), lambda: 3)
    new, old = PrometheusStepMetrics(None, state), _ClientInstruments(state)
    since = time.time()
    rng = random.Random(7)
    checked = 0
    for first, steps in ((0, 0), (0, 1), (1, 28), (29, 40), (69, 200)):
        _feed([new, old], rng, steps, first)
        new_text, new_om = _scrapes(new, since)
        old_text, old_om = _scrapes(old, since)
        assert new_text == old_text
        assert new_om == old_om
        checked += 1
    assert new.rejected == old.rejected > 0
    assert "# {span_id=" in new_om and 'traceml_phase_name="h2d"' in new_text  # exemplars, late series
    assert "traceml_collective_exposed_seconds_count{" in new_text
    assert checked == 5


def test_a_series_appears_with_its_first_measurement_a_negative_count_is_refused(no_created: None) -> None:
    state = LiveState(RankLabels("run-parity", 0, 0, "h", "0"), lambda: 0)
    new, old = PrometheusStepMetrics(None, state), _ClientInstruments(state)
    for metrics in (new, old):
        metrics.record(math.nan, [], None, None)  # rejected: the step counter only
        with pytest.raises(ValueError, match="non-negative"):
            metrics.record_work(-1, None)
    new_text, old_text = _scrapes(new, 0)[0], _scrapes(old, 0)[0]
    assert new_text == old_text
    assert "traceml_steps_total{" in new_text and "traceml_step_duration_seconds_count" not in new_text
    assert "traceml_tokens_total{" not in new_text and "# TYPE traceml_tokens_total counter" in new_text
    assert "traceml_samples_total{" in new_text  # the refused increment made the series, as it did


def test_a_scrape_during_recording_sees_whole_steps() -> None:
    """The scrape thread reads under the recording lock: a step's histogram count and the step
    counter move together, and nothing recorded is lost."""
    state = LiveState(RankLabels("run-threads", 0, 0, "h", "0"), lambda: 0)
    metrics = PrometheusStepMetrics(None, state)
    steps, done = 20_000, threading.Event()

    def train() -> None:
        for _ in range(steps):
            metrics.record(0.002, [("forward", 0.001)], 0.0001, None, (0xA << 124, 0xB))
        done.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    seen: list[tuple[float, float]] = []
    while not done.is_set() or len(seen) < 2:
        text = text_format.generate_latest(metrics.registry).decode()  # type: ignore[arg-type]
        values = _values(text)
        seen.append((values.get("traceml_step_duration_seconds_count", 0.0),
                     values.get("traceml_steps_total", 0.0)))
    trainer.join()
    # The loop's last scrape can come just before the trainer's last step: one more after its end.
    final = _values(text_format.generate_latest(metrics.registry).decode())  # type: ignore[arg-type]
    seen.append((final.get("traceml_step_duration_seconds_count", 0.0),
                 final.get("traceml_steps_total", 0.0)))
    assert all(count == total for count, total in seen), seen[:5]
    assert seen[-1] == (steps, steps)
    assert [count for count, _ in seen] == sorted(count for count, _ in seen)


def _values(text: str) -> dict[str, float]:
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#") and 'le="' not in line}
