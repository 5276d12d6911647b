"""The state both metric paths share: the rank's labels, the live values read at export or
scrape time, the interval peaks, and one step's phase and collective samples.

The OTLP path (emit/step_metrics.py) and the direct scrape path (emit/prometheus_scrape.py)
read the same :class:`LiveState`, so both carry one metric set (docs/telemetry.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from traceml_otel import contract as c
from traceml_otel.emit.spans import SpanData
from traceml_otel.emit.time_metrics import LiveTimeAccount, TimeInstruments
from traceml_otel.step_records import PhaseTiming

NS = 1e-9
"""Seconds per nanosecond."""
FIRST_FAILURE_WAIT_S = 2.0
"""How long a bad end under ``traceml run`` waits for the launcher's first failure before scrapes show it
(:meth:`LiveState.end_for_scrape`); the agent polls its ranks every 0.1 s."""


@dataclass(frozen=True, slots=True)
class RankLabels:
    """What the per-rank info series says about this rank (joins DCGM and node-exporter)."""

    run_id: str
    rank: int
    local_rank: int
    host: str
    version: str
    job: str = ""
    """The job identity across restarts (``traceml_job``); empty: the run id."""
    world_size: int = 0
    """Ranks in the job (the ``traceml_world_size`` gauge): "ranks live < world size"; 0 unknown."""

    @property
    def job_label(self) -> str:
        return self.job or self.run_id


class IntervalPeak:
    """The maximum of the values seen since the last read.

    Each reader (the OTLP export, the Prometheus scrape) owns one, so a peak between two
    reads is never missed. With no new value since the last read it repeats the last
    maximum (the gauge does not vanish during a long step); before any value it is None.
    """

    def __init__(self) -> None:
        self._max: int | None = None
        self._last: int | None = None
        self._lock = threading.Lock()

    def update(self, value: int) -> None:
        with self._lock:
            if self._max is None or value > self._max:
                self._max = value

    def take(self) -> int | None:
        with self._lock:
            if self._max is not None:
                self._last, self._max = self._max, None
            return self._last


class LiveState:
    """The values both readers observe: set by the emitter, read at export or scrape time."""

    def __init__(self, labels: RankLabels, dropped_spans: Callable[[], int]) -> None:
        self.labels = labels
        self.dropped_spans = dropped_spans
        self.last_wait_s: float | None = None
        self.last_step_end_s: float | None = None
        self.ended = 0
        self.ended_at: float | None = None
        """Monotonic time of the end (the linger counts from it)."""
        self.exit: tuple[str, str] | None = None
        """(status, reason) once the rank ended and said how (``traceml.run.exit``)."""
        self.cuda_device: str = ""
        self.gpu_uuid: str = ""
        self.stalled: Callable[[], tuple[float, str]] = lambda: (0.0, "none")
        """Seconds without progress and the phase, from the rank's hang record (emit/hang_events.py)."""
        self.first_failure: Callable[[], tuple[int, str] | None] = lambda: None
        """The launcher's first failure (rank, how), read after the end (emit/first_failure.py)."""
        self.first_failure_expected = False
        """Under ``traceml run``, whose launcher names the rank that failed first in the manifest."""
        self.time = TimeInstruments(LiveTimeAccount())
        """The time counters and MFU inputs (emit/time_metrics.py)."""

    def end_for_scrape(self) -> tuple[tuple[str, str] | None, int, tuple[int, str] | None]:
        """(exit, ended, first failure) as a scrape shows them. A rank that ended badly under ``traceml
        run`` reads as running until the launcher's first failure is read, for at most
        :data:`FIRST_FAILURE_WAIT_S` after its end: a survivor of a killed rank often ends a moment
        before the launcher has written which rank failed first, and a scrape in between showed a failed
        run with a missing rank and no first failure (a page without the cause, then a second page with
        it). The OTLP path exports at its end, after the wait, and is not held back."""
        first = self.first_failure()
        if first is None and self.ended_at is not None and time.monotonic() - self.ended_at < self.end_hold_s:
            return None, 0, None
        return self.exit, self.ended, first

    @property
    def end_hold_s(self) -> float:
        """How long scrapes may read a bad end as running (:meth:`end_for_scrape`): the linger adds it."""
        bad = self.exit is not None and self.exit[0] != "clean"
        return FIRST_FAILURE_WAIT_S if self.first_failure_expected and bad else 0.0

    def info_labels(self) -> dict[str, str]:
        """Label values of the info series (Prometheus names, without run id and rank)."""
        return {
            "traceml_host": self.labels.host,
            "traceml_local_rank": str(self.labels.local_rank),
            "traceml_cuda_device": self.cuda_device,
            "traceml_gpu_uuid": self.gpu_uuid,
            "traceml_version": self.labels.version,
        }


def phase_seconds(phase: PhaseTiming, on_gpu: bool) -> float:
    """A phase's duration in seconds on the step's clock (the GPU's when measured there)."""
    if on_gpu and phase.gpu_duration_ns is not None:
        return phase.gpu_duration_ns * NS
    return (phase.end_ns - phase.start_ns) * NS


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One step's collectives of one (source, kind), as the metrics record them."""

    source: str
    kind: str
    seconds: float | None
    """Total time on the step's clock; ``None``: not measured."""
    exposed: float | None
    """The part the step waited for; ``None``: not measured."""
    calls: int = 0
    nbytes: int = 0


def collective_sample(span: SpanData, on_gpu: bool) -> CollectiveSample:
    """What the metrics record of one collective span, on the step's clock."""
    a = span.attributes
    return CollectiveSample(
        str(a[c.ATTR_COLLECTIVE_SOURCE]), str(a[c.ATTR_COLLECTIVE_KIND]),
        a.get(c.ATTR_COLLECTIVE_GPU if on_gpu else c.ATTR_COLLECTIVE_CPU),  # type: ignore[arg-type]
        a.get(c.ATTR_COLLECTIVE_EXPOSED_GPU if on_gpu else c.ATTR_COLLECTIVE_EXPOSED_CPU),  # type: ignore[arg-type]
        int(a.get(c.ATTR_COLLECTIVE_CALLS, 0)), int(a.get(c.ATTR_COLLECTIVE_BYTES, 0)),
    )
