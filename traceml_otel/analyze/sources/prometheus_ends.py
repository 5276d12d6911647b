"""How a run ended, from a Prometheus-compatible engine: exit status per rank (``traceml_run_exit``),
the hang watchdog's report (``traceml_progress_stalled_seconds``), ranks that vanished without an end
(``traceml_run_ended`` still 0 at their last sample), the world size (``traceml_world_size``) and the
rank ``traceml run`` saw fail first (``traceml_run_first_failure``).

:func:`read_ends` asks five instant queries, one answer per rank; :func:`nearest_run_ids` lists the run
ids the engine knows that are closest to a mistyped one (bounded).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from traceml_otel.analyze.sources.base import SourceError
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.sanitize import strip_control
from traceml_otel.wire.metric_labels import (
    EXIT_REASON_LABEL,
    EXIT_STATUS_LABEL,
    PHASE_LABEL,
    RANK_LABEL,
    RUN_LABEL,
)

MAX_RUN_IDS = 10_000
"""Run ids read from the engine when looking for the nearest ones (the answer is refused above)."""
NEAREST = 5


class EngineQueries(Protocol):
    """What the end queries ask of a Prometheus reader (``sources.prometheus.PrometheusReader`` is one):
    its run, its time range, and its bounded, checked HTTP API calls."""

    run_id: str
    when: TimeRange

    def selector(self, metric: str) -> str: ...
    def instant_query(self, query: str, at: float) -> list[dict[str, Any]]: ...
    def vector_query(self, query: str, at: float) -> dict[int, float]: ...
    def scalar_query(self, query: str, at: float) -> float | None: ...
    def api_data(self, path: str, params: Mapping[str, object]) -> object: ...


@dataclass(frozen=True, slots=True)
class RankExit:
    """One rank's end marker: ``status`` (clean, exception, signal, interrupted) and ``reason``."""

    rank: int
    status: str
    reason: str


@dataclass(frozen=True, slots=True)
class RankStall:
    """One rank's hang, as its watchdog reported it at the end of the run."""

    rank: int
    phase: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RunEnds:
    """What the engine says about the end of the run (empty: nothing known)."""

    exits: tuple[RankExit, ...] = ()
    stalls: tuple[RankStall, ...] = ()
    vanished: tuple[int, ...] = ()
    """Ranks whose last sample still said running (``traceml_run_ended 0``) and that sent no exit."""
    world_size: int | None = None
    first_failure: tuple[int, str] | None = None
    """(rank, how) of the rank ``traceml run`` saw fail first (``traceml_run_first_failure``)."""


def read_ends(reader: EngineQueries, span: str, lookback: str, at: float) -> RunEnds:
    """The end of the run over ``span`` before ``at``; the hang report only if it is in the last
    ``lookback`` (a hang that resolved earlier is not how the run ended)."""
    sel = reader.selector
    exits = []
    for item in reader.instant_query(
        f"max by ({RANK_LABEL}, {EXIT_STATUS_LABEL}, {EXIT_REASON_LABEL}) "
        f"(last_over_time({sel('traceml_run_exit')}[{span}]))", at,
    ):
        rank = _rank(item["metric"].get(RANK_LABEL))
        if rank is not None:
            exits.append(RankExit(rank, _text(item["metric"].get(EXIT_STATUS_LABEL)),
                                  _text(item["metric"].get(EXIT_REASON_LABEL))))
    stalled = sel("traceml_progress_stalled_seconds").replace("}", f',{PHASE_LABEL}!="none"}}')
    stalls = []
    for item in reader.instant_query(
        f"max by ({RANK_LABEL}, {PHASE_LABEL}) (last_over_time({stalled}[{lookback}])) > 0", at,
    ):
        rank, value = _rank(item["metric"].get(RANK_LABEL)), _value(item.get("value"))
        if rank is not None and value is not None:
            stalls.append(RankStall(rank, _text(item["metric"].get(PHASE_LABEL)), value))
    ended = reader.vector_query(
        f"max by ({RANK_LABEL}) (last_over_time({sel('traceml_run_ended')}[{span}]))", at)
    exited = {e.rank for e in exits}
    vanished = tuple(sorted(r for r, v in ended.items() if v == 0 and r not in exited))
    world = reader.scalar_query(f"max(last_over_time({sel('traceml_world_size')}[{span}]))", at)
    firsts = []
    for item in reader.instant_query(
        "max by (traceml_first_failure_rank, traceml_first_failure_reason) "
        f"(last_over_time({sel('traceml_run_first_failure')}[{span}]))", at,
    ):
        rank = _rank(item["metric"].get("traceml_first_failure_rank"))
        if rank is not None:
            firsts.append((rank, _text(item["metric"].get("traceml_first_failure_reason"))))
    return RunEnds(tuple(sorted(exits, key=lambda e: e.rank)), tuple(sorted(stalls, key=lambda s: s.rank)),
                   vanished, int(world) if world and 0 < world < 10_000_000 else None,
                   min(firsts) if firsts else None)


def nearest_run_ids(reader: EngineQueries, start: float, end: float) -> tuple[str, ...]:
    """The run ids with traceml metrics in [start, end] closest to ``reader.run_id`` (at most
    :data:`NEAREST`; none when the engine lists more than :data:`MAX_RUN_IDS`)."""
    data = reader.api_data(f"/api/v1/label/{RUN_LABEL}/values",
                        {"match[]": "traceml_run_ended", "start": f"{start:.3f}", "end": f"{end:.3f}"})
    if not isinstance(data, list) or len(data) > MAX_RUN_IDS:
        return ()
    known = [_text(v, 128) for v in data if isinstance(v, str)]
    close = difflib.get_close_matches(reader.run_id, known, n=NEAREST, cutoff=0.3)
    if len(close) < NEAREST:  # ids sharing its start (a prefix) count as near too
        head = reader.run_id[:6]
        close += [k for k in sorted(known) if head and k.startswith(head) and k not in close]
    return tuple(close[:NEAREST])


def no_such_run(reader: EngineQueries) -> tuple[str, ...]:
    """A line naming the nearest run ids the engine knows in the range (the listing refused: none)."""
    try:
        near = nearest_run_ids(reader, reader.when.start, reader.when.end)
    except SourceError:
        return ()
    if not near:
        return (f"Prometheus has no run {reader.run_id!r} in the range, and no run id near it.",)
    return (f"Prometheus has no run {reader.run_id!r} in the range; nearest run ids: "
            + ", ".join(repr(n) for n in near),)


def _text(value: object, limit: int = 64) -> str:
    return strip_control(value)[:limit] if isinstance(value, str) else ""


def _rank(raw: object) -> int | None:
    if not isinstance(raw, str) or not raw.isascii() or not raw.isdigit() or len(raw) > 8:
        return None
    return int(raw)


def _value(pair: object) -> float | None:
    try:
        return float(pair[1]) if isinstance(pair, list) and len(pair) == 2 else None
    except (TypeError, ValueError):
        return None
