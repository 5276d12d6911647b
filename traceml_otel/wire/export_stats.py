"""``rank-R.export.json``: what one rank's emitter did with its telemetry, in counts.

The emitter keeps one :class:`ExportStats` and rewrites the file as it goes (``final`` is set by
its last write, after OTLP export and metrics were shut down). The launcher's account
(``traceml_otel.launch.export_report``) and the analyzer's run finding
(``traceml_otel.analyze.evidence``) read it back through :func:`read_export_stats`.

The file carries ``export_stats_version``; files without one were written before the field
existed and read as version 1. A newer version is read as far as this code knows its fields,
with a problem saying so; a corrupt file is skipped with a problem naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from traceml_otel.contract import export_stats_file_name, handoff_file_name, rank_of_file
from traceml_otel.wire._json import RecordError, as_float, as_int, as_str, as_version, read_json_object
from traceml_otel.wire.handoff import Handoff, read_handoff

EXPORT_STATS_VERSION = 1
"""The version this code writes and fully reads."""
MAX_RANK_FILES = 65_536
"""Export statistics files read from one run directory; more are left out (and said)."""
_MAX_ENTRIES = 256


@dataclass(slots=True)
class ExportStats:
    """One rank's export statistics (mutable: the emitter counts into it).

    ``steps_traced`` is the trainer's own count of steps it closed (from its goodbye), so
    ``local_copy_complete`` compares what was written with what was traced. ``outputs_disabled``
    maps an output (``"local copy"``, ``"Prometheus endpoint"``, ``"OTLP span export"``,
    ``"metrics"``, ``"export statistics"``) to the reason it was turned off.
    """

    run_id: str
    rank: int
    steps_received: int = 0
    spans_local: int = 0
    steps_local: int = 0
    steps_traced: int | None = None
    local_copy_complete: bool | None = None
    local_copy_closed_unix: float | None = None
    capture_dropped_steps: int = 0
    otlp_endpoint: str | None = None
    otlp_exported: int = 0
    otlp_sampled_out: int = 0
    """Spans ``OTEL_TRACES_SAMPLER`` left out (by design: not loss, not in ``otlp_dropped``)."""
    otlp_budget_dropped: int = 0
    """Spans the span budget (``TRACEML_OTLP_SPANS``) left out (by design: not loss, not in the dropped)."""
    otlp_sample_probability: float | None = None
    """The lowest consistent-sample probability the span budget used (``None``: the budget was off)."""
    otlp_dropped: int = 0
    otlp_drop_reasons: dict[str, int] = field(default_factory=dict)
    otlp_last_error: str | None = None
    metrics_skipped_steps: int = 0
    metrics_endpoint: str | None = None
    """Where OTLP metrics go (``None``: no OTLP metrics)."""
    metric_exports: int = 0
    """OTLP metric export calls that succeeded."""
    metric_export_failures: int = 0
    """OTLP metric export calls that failed (each loses one interval's points for that backend)."""
    metric_last_error: str | None = None
    metric_values_rejected: int = 0
    """Measurements the duration histograms (OTLP, else the scrape endpoint) dropped as not finite or
    negative (a clock fault); the step's spans and other metrics are kept. Files from before the
    field read as 0."""
    outputs_disabled: dict[str, str] = field(default_factory=dict)
    clean_shutdown: bool = False
    end_status: str = "running"
    problems: list[str] = field(default_factory=list)
    final: bool = False
    steps_handed: int | None = None
    """Steps the trainer wrote into the emitter's pipe (from ``rank-R.handoff.json``; else ``None``)."""
    emitter_lost: str | None = None
    """The trainer's word that the emitter died or stopped before its final counts, with the steps
    that never reached the local copy (from ``rank-R.handoff.json``); ``None`` otherwise."""
    version: int = EXPORT_STATS_VERSION

    @property
    def local_copy_incomplete(self) -> bool:
        """The rank's local copy is known to hold fewer steps than the trainer traced."""
        if self.local_copy_complete is False:
            return True
        return self.steps_traced is not None and self.steps_local < self.steps_traced


@dataclass(frozen=True, slots=True)
class ExportStatsRead:
    """Every rank's statistics found in a run directory (by rank), and what could not be read."""

    stats: tuple[ExportStats, ...] = ()
    problems: tuple[str, ...] = ()


def encode_export_stats(stats: ExportStats) -> str:
    """The JSON text of ``stats`` (no padding; the emitter pads it)."""
    data = asdict(stats)
    data.pop("version")
    return json.dumps({"export_stats_version": EXPORT_STATS_VERSION, **data}, indent=2) + "\n"


def _count(data: dict[str, object], name: str) -> int:
    value = as_int(data.get(name))
    return value if value is not None and value >= 0 else 0


def _optional_count(data: dict[str, object], name: str) -> int | None:
    value = as_int(data.get(name))
    return value if value is not None and value >= 0 else None


def _str_map(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    return {str(k)[:200]: str(v)[:2000] for k, v in list(raw.items())[:_MAX_ENTRIES]}


def _count_map(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    counts = {str(k)[:200]: as_int(v) for k, v in list(raw.items())[:_MAX_ENTRIES]}
    return {k: v for k, v in counts.items() if v is not None and v >= 0}


def _probability(raw: object) -> float | None:
    value = as_float(raw)
    return value if value is not None and 0 < value <= 1 else None


def _flag(raw: object) -> bool | None:
    return raw if isinstance(raw, bool) else None


def decode_export_stats(data: dict[str, object]) -> ExportStats:
    """The record in a decoded ``rank-R.export.json``.

    Raises:
        RecordError: no ``rank`` (the one field without which the counts mean nothing).
    """
    rank = as_int(data.get("rank"))
    if rank is None or rank < 0:
        raise RecordError("no rank in it")
    problems = data.get("problems")
    return ExportStats(
        run_id=as_str(data.get("run_id"), 512) or "",
        rank=rank,
        steps_received=_count(data, "steps_received"),
        spans_local=_count(data, "spans_local"),
        steps_local=_count(data, "steps_local"),
        steps_traced=_optional_count(data, "steps_traced"),
        local_copy_complete=_flag(data.get("local_copy_complete")),
        local_copy_closed_unix=as_float(data.get("local_copy_closed_unix")),
        capture_dropped_steps=_count(data, "capture_dropped_steps"),
        otlp_endpoint=as_str(data.get("otlp_endpoint"), 2000),
        otlp_exported=_count(data, "otlp_exported"),
        otlp_sampled_out=_count(data, "otlp_sampled_out"),
        otlp_budget_dropped=_count(data, "otlp_budget_dropped"),
        otlp_sample_probability=_probability(data.get("otlp_sample_probability")),
        otlp_dropped=_count(data, "otlp_dropped"),
        otlp_drop_reasons=_count_map(data.get("otlp_drop_reasons")),
        otlp_last_error=as_str(data.get("otlp_last_error"), 2000),
        metrics_skipped_steps=_count(data, "metrics_skipped_steps"),
        metrics_endpoint=as_str(data.get("metrics_endpoint"), 2000),
        metric_exports=_count(data, "metric_exports"),
        metric_export_failures=_count(data, "metric_export_failures"),
        metric_last_error=as_str(data.get("metric_last_error"), 2000),
        metric_values_rejected=_count(data, "metric_values_rejected"),
        outputs_disabled=_str_map(data.get("outputs_disabled")),
        clean_shutdown=data.get("clean_shutdown") is True,
        end_status=as_str(data.get("end_status"), 500) or "",
        problems=[str(p)[:2000] for p in problems[:_MAX_ENTRIES]] if isinstance(problems, list) else [],
        final=data.get("final", True) is True,  # files from before the field was added were final
        steps_handed=_optional_count(data, "steps_handed"),
        emitter_lost=as_str(data.get("emitter_lost"), 2000),
        version=as_version(data.get("export_stats_version")) or 1,
    )


def read_export_stats_file(path: Path) -> ExportStats:
    """One statistics file. Raises :class:`RecordError` when it cannot be read or is not one."""
    try:
        return decode_export_stats(read_json_object(path))
    except RecordError as error:
        message = str(error)
        raise RecordError(message if message.startswith(str(path)) else f"{path}: {message}") from None


def rank_file_paths(run_dir: Path, file_name: Callable[[int], str]) -> list[tuple[int, Path]]:
    """(rank, path) of every per-rank file named by ``file_name`` in ``run_dir``, by rank (bounded)."""
    found: list[tuple[int, Path]] = []
    try:
        with os.scandir(run_dir) as entries:
            for entry in entries:
                rank = rank_of_file(entry.name, file_name)
                if rank is not None:
                    found.append((rank, Path(entry.path)))
                    if len(found) >= MAX_RANK_FILES:
                        break
    except OSError:
        return []
    return sorted(found)


def export_stats_paths(run_dir: Path) -> list[tuple[int, Path]]:
    """(rank, path) of every ``rank-R.export.json`` in ``run_dir``, by rank (bounded)."""
    return rank_file_paths(run_dir, export_stats_file_name)


def with_handoff(stats: ExportStats | None, handoff: Handoff) -> ExportStats:
    """Fold the trainer's handoff record into the rank's statistics (a new record when it had none).

    Statistics the emitter finished (``final``) keep their counts: it only gains the trainer's
    traced count when it lacked one, and a note. Stale ones (the emitter died or was stopped)
    gain ``emitter_lost``, naming the steps that never reached the local copy.
    """
    if stats is None:
        stats = ExportStats(run_id=handoff.run_id, rank=handoff.rank, end_status=handoff.end_status)
    if stats.steps_traced is None:
        stats.steps_traced = handoff.steps_traced
    stats.steps_handed = handoff.steps_handed
    stats.capture_dropped_steps = max(stats.capture_dropped_steps, handoff.steps_dropped)
    if stats.final:
        if stats.local_copy_complete is None:
            stats.local_copy_complete = stats.steps_local >= stats.steps_traced
        stats.problems.append(f"at the trainer's exit its telemetry process {handoff.emitter}; it finished "
                              "later on its own")
        if not stats.clean_shutdown:  # the goodbye never reached it: the trainer's own word on the end
            stats.end_status = f"the trainer ended ({handoff.end_status}) after giving its emitter up"
        return stats
    missing = max(0, handoff.steps_traced - stats.steps_local)
    stats.local_copy_complete = missing == 0
    stats.end_status = handoff.end_status or stats.end_status
    stats.emitter_lost = (f"telemetry process {handoff.emitter} at step ~{stats.steps_local:,}; {missing:,} "
                          f"of {handoff.steps_traced:,} traced steps not written to the local copy")
    return stats


def read_export_stats(run_dir: Path) -> ExportStatsRead:
    """Every rank's statistics in ``run_dir`` with the trainers' handoff records folded in;
    unreadable or corrupt files are skipped and named."""
    by_rank: dict[int, ExportStats] = {}
    problems: list[str] = []
    for _, path in export_stats_paths(run_dir):
        try:
            record = read_export_stats_file(path)
        except RecordError as error:
            problems.append(f"export statistics skipped: {error}")
            continue
        if record.version > EXPORT_STATS_VERSION:
            problems.append(f"{path}: export statistics version {record.version} is newer than this "
                            f"traceml-otel reads ({EXPORT_STATS_VERSION}); fields it added are ignored")
        by_rank[record.rank] = record
    for rank, _ in rank_file_paths(run_dir, handoff_file_name):
        try:
            handoff = read_handoff(run_dir, rank)
        except RecordError as error:
            problems.append(f"trainer handoff record skipped: {error}")
            continue
        if handoff is not None:
            by_rank[rank] = with_handoff(by_rank.get(rank), handoff)
    return ExportStatsRead(tuple(by_rank[r] for r in sorted(by_rank)), tuple(problems))
