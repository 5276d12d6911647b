"""A run's summary for ``compare``, read from its JSON report (``report.json`` or a fresh rendering)."""

from __future__ import annotations

from collections.abc import Mapping

from traceml_otel.analyze.compare_policy import PHASES, RunSummary
from traceml_otel.errors import TracemlError
from traceml_otel.report.json_report import SCHEMA, SCHEMA_VERSION


class ReportFormatError(TracemlError, ValueError):
    """A JSON file that is not a traceml-otel report this version can read."""



def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summary_from_report(report: Mapping[str, object], label: str) -> RunSummary:
    """Read the fields ``compare`` uses from a JSON report; raises :class:`ReportFormatError`."""
    if report.get("schema") != SCHEMA:
        raise ReportFormatError(f"{label}: not a traceml-otel report (schema {report.get('schema')!r})")
    version = report.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ReportFormatError(f"{label}: report schema version {version!r} is newer than this tool reads")
    try:
        primary = report["primary_diagnosis"]
        phases = {p["name"]: _number(p["median_s"]) for p in report["phases"]}  # type: ignore[index, union-attr]
        memory = report["memory"]["ranks"]  # type: ignore[index]
        run = report["run"]
        window = report["window"]
    except (KeyError, TypeError) as error:
        raise ReportFormatError(f"{label}: report lacks {error}") from None
    peaks = [
        _number(m.get("peak_reserved_bytes")) or _number(m.get("peak_allocated_bytes"))
        for m in memory
        if isinstance(m, dict)
    ]
    known = [p for p in peaks if p is not None]
    work = report.get("throughput")
    work = work if isinstance(work, dict) else {}
    return RunSummary(
        label=label,
        run_id=str(run.get("run_id", "")),  # type: ignore[union-attr]
        kind=str(primary.get("kind", "")),  # type: ignore[union-attr]
        severity=str(primary.get("severity", "")),  # type: ignore[union-attr]
        clock=str(report.get("clock", "")),
        steps=int(window.get("steps") or 0),  # type: ignore[union-attr]
        step_time=phases.get("step_time"),
        phases=tuple((name, phases.get(name)) for name in PHASES),
        peak_memory=int(max(known)) if known else None,
        samples_per_step=_number(work.get("samples_per_step")),
        time_per_sample=_number(work.get("time_per_sample_s")),
        tokens_per_step=_number(work.get("tokens_per_step")),
        time_per_token=_number(work.get("time_per_token_s")),
        goodput=_member(report, "time_accounting", "goodput"),
        mfu=_member(report, "mfu", "mfu"),
    )


def _member(report: Mapping[str, object], section: str, name: str) -> float | None:
    """A number inside an optional section of the report (``None`` when absent or malformed)."""
    value = report.get(section)
    return _number(value.get(name)) if isinstance(value, dict) else None


