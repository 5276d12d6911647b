"""Peak FLOP/s of current datacenter accelerators by dtype: the analyzer's MFU and the emitter's live
``traceml.peak_flops`` read the same table (``docs/goodput.md``)."""

from __future__ import annotations

PEAK_FLOPS: dict[str, dict[str, float]] = {
    # Dense (no sparsity) peaks per GPU from the vendors' data sheets, FLOP/s. Longest match wins.
    "B200": {"fp8": 4.5e15, "bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15, "fp32": 80e12},
    "H200": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H100 PCIe": {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100 NVL": {"fp8": 1671e12, "bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100": {"fp8": 1979e12, "bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"fp8": 733e12, "bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "L4": {"fp8": 242e12, "bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "MI300X": {"fp8": 2615e12, "bf16": 1307e12, "fp16": 1307e12, "tf32": 654e12, "fp32": 163.4e12},
}
"""Device name fragment (as in ``torch.cuda.get_device_name``) -> dtype -> peak FLOP/s."""


def table_peak(device_name: str, dtype: str) -> float | None:
    """The table's peak for ``device_name`` and ``dtype`` (the longest matching name), else ``None``."""
    matches = [name for name in PEAK_FLOPS if name.lower() in device_name.lower()]
    if not matches:
        return None
    return PEAK_FLOPS[max(matches, key=len)].get(dtype)
