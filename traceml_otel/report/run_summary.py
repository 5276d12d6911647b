"""A run's summary for ``compare``, read from a stored JSON report (``report.json``).

A fresh run is summarised from its analysis directly (``analyze.compare_policy.summary_of``); this
reads the same fields from the report's documented form (docs/report-schema.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from traceml_otel.analyze.compare_noise import NoiseFormatError, noise_from_json
from traceml_otel.analyze.compare_summary import PHASES, RunSummary, filled, peak_memory, unusable_summary
from traceml_otel.errors import TracemlError
from traceml_otel.report.json_report import SCHEMA, SCHEMA_VERSION


class ReportFormatError(TracemlError, ValueError):
    """A JSON file that is not a traceml-otel report this version can read."""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _section(report: Mapping[str, object], name: str, label: str) -> Mapping[str, object]:
    value = report.get(name)
    if not isinstance(value, Mapping):
        raise ReportFormatError(f"{label}: report lacks '{name}'")
    return value


def _records(value: object, what: str, label: str) -> list[Mapping[str, object]]:
    """The objects of a list member (other items passed over)."""
    if not isinstance(value, list):
        raise ReportFormatError(f"{label}: report lacks '{what}'")
    return [item for item in value if isinstance(item, Mapping)]


def summary_from_report(report: Mapping[str, object], label: str) -> RunSummary:
    """Read the fields ``compare`` uses from a JSON report; raises :class:`ReportFormatError`."""
    if report.get("schema") != SCHEMA:
        raise ReportFormatError(f"{label}: not a traceml-otel report (schema {report.get('schema')!r})")
    version = report.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ReportFormatError(
            f"{label}: malformed report: schema_version {_bounded(version)} is not an integer")
    if version > SCHEMA_VERSION:
        raise ReportFormatError(f"{label}: report schema version {version} is newer than this tool reads")
    bad = non_finite_at(report)
    if bad:
        return unusable_summary(label, f"bad data: {bad} is not a finite number")
    try:
        noise = noise_from_json(report.get("noise"))
    except NoiseFormatError as error:
        return unusable_summary(label, f"bad data: {error}")
    primary = _section(report, "primary_diagnosis", label)
    run = _section(report, "run", label)
    window = _section(report, "window", label)
    phases = _records(report.get("phases"), "phases", label)
    try:
        medians = {str(p["name"]): _number(p["median_s"]) for p in phases}
    except KeyError as error:
        raise ReportFormatError(f"{label}: report lacks {error}") from None
    memory = _records(_section(report, "memory", label).get("ranks"), "memory.ranks", label)
    work = report.get("throughput")
    work = work if isinstance(work, Mapping) else {}
    steps = _number(window.get("steps"))
    return filled(RunSummary(
        label=label,
        run_id=str(run.get("run_id", "")),
        kind=str(primary.get("kind", "")),
        severity=str(primary.get("severity", "")),
        clock=str(report.get("clock", "")),
        steps=int(steps or 0),
        step_time=medians.get("step_time") or medians.get("traced"),
        phases=tuple((name, medians.get(name)) for name in PHASES),
        peak_memory=peak_memory([(_number(m.get("peak_reserved_bytes")),
                                  _number(m.get("peak_allocated_bytes"))) for m in memory]),
        samples_per_step=_number(work.get("samples_per_step")),
        time_per_sample=_number(work.get("time_per_sample_s")),
        tokens_per_step=_number(work.get("tokens_per_step")),
        time_per_token=_number(work.get("time_per_token_s")),
        goodput=_member(report, "time_accounting", "goodput"),
        mfu=_member(report, "mfu", "mfu"),
        noise=noise,
    ))


def _bounded(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def non_finite_at(value: object, path: str = "", depth: int = 0) -> str:
    """Where the first NaN or infinite number sits in a decoded report (``a.b[2]``); empty when none.

    Python's JSON reader takes ``NaN`` and ``Infinity`` tokens; a report holding them is bad data."""
    if isinstance(value, float):
        return "" if math.isfinite(value) else (path or "the report")
    if depth > 12:
        return ""
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = non_finite_at(item, f"{path}.{str(key)[:40]}" if path else str(key)[:40], depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = non_finite_at(item, f"{path}[{index}]", depth + 1)
            if found:
                return found
    return ""


def _member(report: Mapping[str, object], section: str, name: str) -> float | None:
    """A number inside an optional section of the report (``None`` when absent or malformed)."""
    value = report.get(section)
    return _number(value.get(name)) if isinstance(value, Mapping) else None
