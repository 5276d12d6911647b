"""The "Communication" row: exposed share per rank (the alert's series) and collective time by kind."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import dashed, row, target, timeseries
from traceml_otel.stack.queries import REC


def communication_row(y: int) -> list[dict[str, Any]]:
    """Exposed communication share across ranks (left) and collective time per step by kind (right)."""
    return [row("Communication", y), _exposed_share(y + 1), _collective_time(y + 1)]


def _exposed_share(y: int) -> dict[str, Any]:
    shares = 'run_rank:traceml_communication_share:ratio{traceml_run_id="$run_id"}'
    share = 'run_rank:traceml_communication_share:ratio{traceml_run_id="$run_id", traceml_rank=~"$rank"}'
    least = 'run:traceml_communication_share:min{traceml_run_id="$run_id"}'
    return timeseries(
        "Exposed communication share across ranks, and the selected ranks",
        "Exposed collective time (the part of the collectives the step waited for, not overlapped "
        "with compute) / step time (input wait + traced step), per rank, and the rank that waits "
        "least. Alert TraceMLCommunicationBound: the least-waiting rank >= 10 % (warning), >= 20 % "
        "(critical). A rank far above the others waits for a straggler (TraceMLSyncStraggler). Empty "
        "without collective timing (one process, collectives=False) or where the exposed part is not "
        "measured (async_op calls, CUDA side streams). Needs the recording rules.",
        (0, y, 12, 8),
        "percentunit",
        [
            target("A", share, "rank {{traceml_rank}}"),
            target("B", least, "least-waiting rank (alert)"),
            target("C", f"quantile (0.5, {shares})", "median rank"),
            target("D", f"max ({shares})", "max rank"),
        ],
        threshold_steps=(("orange", 0.1), ("red", 0.2)),
        no_value="No exposed collective time: no collectives timed, or their exposed part not measured.",
        overrides=[dashed("least-waiting rank (alert)", {"id": "custom.lineWidth", "value": 2})],
    )


def _collective_time(y: int) -> dict[str, Any]:
    def per_step(recorded: str) -> str:
        return f"{recorded}{{{REC}}}"

    return timeseries(
        "Collective time per step by kind (all ranks)",
        "Total collective time per step (calls' durations, overlap with compute included) and its "
        "exposed part, per source (ddp: gradient buckets, api: torch.distributed calls) and kind, "
        "from traceml_collective_duration_seconds and traceml_collective_exposed_seconds. Total minus "
        "exposed is what compute hid.",
        (12, y, 12, 8),
        "s",
        [
            target(
                "A",
                per_step("run:traceml_collective_seconds:per_step"),
                "{{traceml_collective_source}} {{traceml_collective_kind}} total",
            ),
            target(
                "B",
                per_step("run:traceml_collective_exposed_seconds:per_step"),
                "{{traceml_collective_source}} {{traceml_collective_kind}} exposed",
            ),
        ],
        no_value="No collectives timed in this run.",
    )
