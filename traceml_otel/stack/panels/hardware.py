"""The "Memory, GPU and host" row: CUDA peak memory, DCGM's GPU series and node-exporter's host CPU,
joined to the run's ranks and hosts through ``traceml_rank_info``."""

from __future__ import annotations

from typing import Any

from traceml_otel.stack.grafana import Grid, row, target, timeseries
from traceml_otel.stack.queries import GPU_OF_RANK, HOST_OF_RUN, RANKS, RUN, WINDOW

DCGM_NOTE = (
    "No data: this Prometheus has no NVIDIA DCGM exporter series for the GPUs of this run "
    "(a CPU run, CUDA not yet initialised, or no DCGM exporter scraped)."
)
NODE_NOTE = "No data: no node-exporter series (node_uname_info) for the hosts of this run."


def hardware_row(y: int) -> list[dict[str, Any]]:
    """CUDA memory and GPU utilisation (y+1), bandwidth and power (y+9), host CPU (y+17)."""
    return [
        row("Memory, GPU and host", y),
        _cuda_memory(y + 1),
        _dcgm("GPU utilization (DCGM)", "DCGM_FI_DEV_GPU_UTIL", "percent", (12, y + 1, 12, 8)),
        _dcgm(
            "GPU memory bandwidth utilization (DCGM)",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "percent",
            (0, y + 9, 12, 8),
        ),
        _dcgm("GPU power (DCGM)", "DCGM_FI_DEV_POWER_USAGE", "watt", (12, y + 9, 12, 8)),
        _host_cpu(y + 17),
    ]


def _cuda_memory(y: int) -> dict[str, Any]:
    return timeseries(
        "CUDA peak memory across ranks, and the selected ranks",
        "torch.cuda max_memory_reserved / max_memory_allocated, the maximum over each export interval. "
        "Alert "
        "TraceMLCudaMemoryCreep: reserved rising >= 1 GiB per hour. Empty on CPU runs.",
        (0, y, 12, 8),
        "bytes",
        [
            target("A", f"max (traceml_cuda_memory_peak_reserved_bytes{{{RUN}}})", "reserved, max rank"),
            target(
                "B",
                f"quantile (0.5, traceml_cuda_memory_peak_reserved_bytes{{{RUN}}})",
                "reserved, median rank",
            ),
            target("C", f"max (traceml_cuda_memory_peak_allocated_bytes{{{RUN}}})", "allocated, max rank"),
            target(
                "D",
                f"max by (traceml_rank) (traceml_cuda_memory_peak_reserved_bytes{{{RANKS}}})",
                "reserved rank {{traceml_rank}}",
            ),
        ],
        no_value="No CUDA memory: a CPU run, or CUDA not initialised yet.",
    )


def _dcgm(title: str, metric: str, unit: str, grid: Grid) -> dict[str, Any]:
    expr = f"max by (UUID) ({metric}) * on (UUID) group_left (traceml_rank) {GPU_OF_RANK}"
    return timeseries(
        title,
        f"{metric} from the NVIDIA DCGM exporter, joined to ranks through traceml_rank_info's "
        f"traceml_gpu_uuid (= DCGM's UUID label). {DCGM_NOTE}",
        grid,
        unit,
        [target("A", expr, "rank {{traceml_rank}}")],
        no_value=DCGM_NOTE,
    )


def _host_cpu(y: int) -> dict[str, Any]:
    cpu = (
        f'max by (nodename) ((1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"}}[{WINDOW}]))) '
        f"* on (instance) group_left (nodename) node_uname_info) * on (nodename) group_left () {HOST_OF_RUN}"
    )
    return timeseries(
        "Host CPU busy (node-exporter)",
        "1 - idle share of all CPUs of each host of the run (busiest, median, least busy), from "
        "node-exporter, joined through "
        f"node_uname_info's nodename = traceml_rank_info's traceml_host. {NODE_NOTE}",
        (0, y, 12, 8),
        "percentunit",
        [
            target("A", f"max ({cpu})", "busiest host"),
            target("B", f"quantile (0.5, {cpu})", "median host"),
            target("C", f"min ({cpu})", "least busy host"),
        ],
        no_value=NODE_NOTE,
    )
