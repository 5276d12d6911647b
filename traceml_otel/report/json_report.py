"""The JSON report: a versioned, documented (docs/report-schema.md) form of a run analysis."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict

from traceml_otel.analyze.compare_noise import noise_json
from traceml_otel.analyze.findings import Abstention, Finding, MetricSummary, RankMetrics
from traceml_otel.analyze.run_analysis import RunAnalysis
from traceml_otel.contract import CONTRACT_VERSION
from traceml_otel.report.captures_section import captures_json
from traceml_otel.report.events_section import events_json
from traceml_otel.report.time_section import time_json
from traceml_otel.report.units import trace_link

SCHEMA = "traceml-otel/report"
SCHEMA_VERSION = 2
"""Bump on any breaking change to the report layout (renamed or removed keys, changed units)."""


def finding_json(finding: Finding) -> dict[str, object]:
    """A finding as JSON: stable ``kind``, ``severity``, ``score`` and the Why / Next text."""
    return {
        "kind": str(finding.kind),
        "severity": str(finding.severity),
        "score": finding.score,
        "title": finding.title,
        "why": finding.why,
        "next": finding.next,
        "evidence": [{"name": e.name, "value": e.value, "unit": e.unit} for e in finding.evidence],
    }


def _abstention_json(abstention: Abstention) -> dict[str, object]:
    return {"rule": abstention.rule, "missing": [asdict(c) for c in abstention.missing]}


def _summary_json(summary: MetricSummary) -> dict[str, object]:
    return {
        "name": summary.name,
        "median_s": summary.median,
        "worst_s": summary.worst,
        "worst_rank": summary.worst_rank,
        "skew": summary.skew,
        "share": summary.share,
        "measured_ranks": summary.measured_ranks,
        "observed_ranks": summary.observed_ranks,
    }


def _rank_json(m: RankMetrics) -> dict[str, object]:
    return {
        "rank": m.rank,
        "steps": m.steps,
        "step_time_s": m.step_time,
        "input_wait_s": m.input_wait,
        "traced_s": m.traced,
        "forward_s": m.forward,
        "backward_s": m.backward,
        "optimizer_s": m.optimizer,
        "h2d_s": m.h2d,
        "h2d_measured": m.h2d_measured,
        "compute_s": m.compute,
        "residual_s": m.residual,
        "optimizer_updates": m.optimizer_updates,
        "micro_steps": m.micro_steps,
        "samples_per_step": m.samples_per_step,
        "samples_per_s": m.samples_per_s,
        "tokens_per_step": m.tokens_per_step,
        "tokens_per_s": m.tokens_per_s,
        "communication_s": m.communication,
        "communication_total_s": m.communication_total,
        "communication_bytes": m.communication_bytes,
        "communication_measured": m.communication_measured,
        "communication_calls": m.communication_calls,
        "communication_waiting_s": m.communication_waiting,
        "communication_transfer_s": m.communication_transfer,
        "communication_waited_for": [{"rank": rank, "waiting_s": s} for rank, s in m.waited_for],
        "communication_split_basis": m.split_basis or None,
        "between_steps_s": m.between_steps,
    }


def report_json(
    analysis: RunAnalysis, generated_at: float | None = None, *, trace_url: str | None = None
) -> dict[str, object]:
    """The report as a JSON-ready object (see docs/report-schema.md)."""
    run = analysis.run
    memory = analysis.memory
    drift = analysis.drift
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "contract_version": CONTRACT_VERSION,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(generated_at)),
        "run": {
            "run_id": run.run_id,
            "source": run.source,
            "service": run.service,
            "world_size": run.world_size,
            "ranks": list(run.ranks),
            "parallelism": run.parallelism,
            "step_sources": list(run.step_sources),
            "command": run.command,
            "start_time": run.start_time,
            "end_time": run.end_time,
            "exit_code": run.exit_code,
            "spans_read": run.spans_read,
            "steps_read": run.steps_read,
            "failed_steps": run.failed_steps,
            "other_run_ids": list(run.other_run_ids),
            "warnings_total": run.warnings_total,
            "warnings": list(run.warnings),
            "missing_ranks": list(run.missing_ranks),
            "rank_steps": [asdict(count) for count in run.rank_steps],
            "failures": [asdict(failure) for failure in run.failures],
        },
        "run_findings": [finding_json(f) for f in analysis.run_findings],
        "window": asdict(analysis.window),
        "clock": str(analysis.clock),
        "primary_diagnosis": finding_json(analysis.step.primary),
        "issues": [finding_json(f) for f in analysis.step.issues],
        "abstentions": [_abstention_json(a) for a in analysis.step.abstentions],
        "severity_caps": list(analysis.step.caps),
        "phases": [_summary_json(s) for s in analysis.summaries],
        "ranks": [_rank_json(m) for m in analysis.ranks],
        "accumulation": asdict(analysis.accumulation),
        "throughput": asdict(analysis.throughput),
        "input_pipeline": [asdict(host) for host in analysis.hosts],
        "memory": {
            "status": str(memory.status),
            "findings": [finding_json(f) for f in memory.findings],
            "pressure": memory.pressure,
            "imbalance": memory.imbalance,
            "growth_bytes": memory.growth_bytes,
            "ranks": [
                {
                    "rank": m.rank,
                    "peak_allocated_bytes": m.peak_allocated,
                    "peak_reserved_bytes": m.peak_reserved,
                    "total_bytes": m.total,
                }
                for m in memory.ranks
            ],
        },
        "drift": {
            "kind": str(drift.kind),
            "baseline_s": drift.baseline_s,
            "recent_s": drift.recent_s,
            "change": drift.change,
            "since_step": drift.since_step,
            "baseline_steps": list(drift.baseline_steps) if drift.baseline_steps else None,
            "recent_steps": list(drift.recent_steps) if drift.recent_steps else None,
            "segment_steps": list(drift.segment_steps) if drift.segment_steps else None,
            "segment_start_time": drift.segment_start_unix,
            "segment_change": drift.segment_change,
            "segment_typical_s": drift.segment_typical_s,
            "reference_steps": list(drift.reference_steps) if drift.reference_steps else None,
            "from_segment": drift.from_segment,
            "band_buckets": list(drift.band_buckets) if drift.band_buckets else None,
        },
        **events_json(analysis),
        **captures_json(analysis),
        "worst_steps": [
            {
                "step": w.step,
                "rank": w.rank,
                "step_time_s": w.step_time,
                "trace_id": w.trace_id,
                "trace_url": trace_link(trace_url, w.trace_id),
                "dominant": w.dominant,
                "dominant_s": w.dominant_s,
            }
            for w in analysis.worst_steps
        ],
        "series": [
            {
                "rank": s.rank,
                "steps": list(s.steps),
                "step_time_s": list(s.step_time),
                "peak_reserved_bytes": list(s.peak_reserved),
            }
            for s in analysis.series
        ],
        **time_json(analysis.time_account, analysis.mfu),
        "noise": noise_json(analysis.noise),
    }


class JsonReporter:
    """Renders a run analysis as the versioned JSON report."""

    def __init__(self, trace_url: str | None = None) -> None:
        self.trace_url = trace_url

    def render(self, analysis: RunAnalysis) -> str:
        document = report_json(analysis, trace_url=self.trace_url)
        try:
            return json.dumps(document, indent=2, allow_nan=False) + "\n"
        except ValueError:  # a derived number overflowed (huge finite inputs): never a crash, null instead
            return json.dumps(_finite(document), indent=2, allow_nan=False) + "\n"


def _finite(value: object) -> object:
    """``value`` with every infinite or NaN float replaced by ``None`` (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
