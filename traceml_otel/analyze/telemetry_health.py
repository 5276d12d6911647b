"""What the emitters' own statistics say about the telemetry the diagnosis rests on.

Each rank's emitter writes ``rank-R.export.json`` (:mod:`traceml_otel.wire.export_stats`). When a
run directory is analysed, those records become one run finding, ``TELEMETRY_DEGRADED``, naming
per rank every output that was turned off and why (a read-only or full local copy, a busy
Prometheus port, a failing exporter), an incomplete local copy, steps lost before the emitter,
spans and metric exports OTLP did not deliver, measurements the duration histograms dropped (not
finite or negative), and a shutdown that was not clean.

A rank whose emitter died or stopped before its final counts is named from the trainer's handoff
record (``rank-R.handoff.json``, folded in by the reader): the steps traced that never reached the
local copy.

Severity: ``warning`` when an output was turned off, a local copy is incomplete or steps were lost
before the emitter (the diagnosis, or the dashboards and alerts, miss data); ``info`` when only OTLP
delivery failed or measurements were dropped from the histograms (the local copy has the spans).
An incomplete local copy also caps the step-time verdict at warning (:func:`confidence_caps`).
Spans read from Tempo or Jaeger come with no such files, and nothing is said.
"""

from __future__ import annotations

from collections.abc import Sequence

from traceml_otel.analyze.findings import Evidence, Finding
from traceml_otel.analyze.kinds import RunKind, Severity
from traceml_otel.wire.export_stats import ExportStats

MAX_DETAILS = 24
"""Per-rank statements listed in the finding; more are counted."""


def _key(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text.lower()).strip("_")


def _rank_details(stats: ExportStats) -> tuple[list[str], list[Evidence], bool]:
    """(statements, evidence, serious) for one rank."""
    rank = stats.rank
    said: list[str] = []
    evidence: list[Evidence] = []
    serious = False
    for output, reason in stats.outputs_disabled.items():
        said.append(f"rank {rank}: {output} turned off ({reason})")
        evidence.append(Evidence(f"rank_{rank}_disabled_{_key(output)}", reason))
        serious = True
    if stats.emitter_lost:
        said.append(f"rank {rank}: {stats.emitter_lost}, so this diagnosis lacks them")
        evidence.append(Evidence(f"rank_{rank}_emitter_lost", stats.emitter_lost))
        serious = True
    elif stats.local_copy_incomplete:
        traced = "?" if stats.steps_traced is None else str(stats.steps_traced)
        said.append(f"rank {rank}: the local copy holds {stats.steps_local} of {traced} traced steps, "
                    "so this diagnosis lacks the rest")
        evidence += [Evidence(f"rank_{rank}_steps_local", stats.steps_local),
                     Evidence(f"rank_{rank}_steps_traced", stats.steps_traced)]
        serious = True
    if stats.capture_dropped_steps:
        said.append(f"rank {rank}: {stats.capture_dropped_steps} steps were lost before the emitter")
        evidence.append(Evidence(f"rank_{rank}_capture_dropped_steps", stats.capture_dropped_steps))
        serious = True
    if stats.otlp_dropped:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(stats.otlp_drop_reasons.items()))
        said.append(f"rank {rank}: {stats.otlp_dropped} spans were not delivered over OTLP to "
                    f"{stats.otlp_endpoint or 'the endpoint'}" + (f" ({reasons})" if reasons else ""))
        evidence.append(Evidence(f"rank_{rank}_otlp_dropped_spans", stats.otlp_dropped))
    if stats.metric_export_failures:
        total = stats.metric_exports + stats.metric_export_failures
        cause = f" ({stats.metric_last_error})" if stats.metric_last_error else ""
        said.append(f"rank {rank}: {stats.metric_export_failures} of {total} OTLP metric exports to "
                    f"{stats.metrics_endpoint or 'the endpoint'} failed{cause}")
        evidence.append(Evidence(f"rank_{rank}_metric_export_failures", stats.metric_export_failures))
    if stats.metric_values_rejected:
        said.append(f"rank {rank}: {stats.metric_values_rejected} measurements not finite or negative (a "
                    "clock fault?) were left out of the duration histograms")
        evidence.append(Evidence(f"rank_{rank}_metric_values_rejected", stats.metric_values_rejected))
    if stats.final and not stats.clean_shutdown and stats.end_status:
        said.append(f"rank {rank}: telemetry did not shut down cleanly ({stats.end_status}); steps after the "
                    "last hand-off may be missing")
        evidence.append(Evidence(f"rank_{rank}_end_status", stats.end_status))
    for problem in stats.problems:
        said.append(f"rank {rank}: {problem}")
    return said, evidence, serious


def telemetry_finding(stats: Sequence[ExportStats]) -> Finding | None:
    """One finding over every rank's export statistics, or ``None`` when nothing was lost or turned off."""
    statements: list[str] = []
    evidence: list[Evidence] = []
    ranks: list[int] = []
    serious = False
    for record in stats:
        said, proof, grave = _rank_details(record)
        if said:
            ranks.append(record.rank)
            statements += said
            evidence += proof
            serious = serious or grave
    if not statements:
        return None
    more = len(statements) - MAX_DETAILS
    listed = "; ".join(statements[:MAX_DETAILS]) + (f"; and {more} more" if more > 0 else "")
    who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
    return Finding(
        kind=RunKind.TELEMETRY_DEGRADED,
        severity=Severity.WARNING if serious else Severity.INFO,
        score=None,
        title=f"{who}: telemetry outputs lost data or were turned off",
        why=f"The emitters' export statistics say: {listed}.",
        next=("Fix the named cause (free the port, a writable runs folder with space, a reachable "
              "endpoint); rank-R.export.json in the run directory has every count."),
        evidence=tuple(evidence[:4 * MAX_DETAILS]),
    )


def confidence_caps(stats: Sequence[ExportStats]) -> tuple[str, ...]:
    """Reasons to cap the step-time verdict at warning: ranks whose local copy is incomplete."""
    short = [s for s in stats if s.local_copy_incomplete]
    if not short:
        return ()
    ranks = ", ".join(
        f"rank {s.rank} {s.steps_local} of {'?' if s.steps_traced is None else s.steps_traced}"
        for s in short[:8]
    )
    return (f"incomplete local copy ({ranks} traced steps written)",)
