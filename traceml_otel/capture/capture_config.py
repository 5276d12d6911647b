"""Which automatic hooks a training session installs: ``init()``'s ``mode`` and ``patch_*`` arguments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MODES = ("auto", "manual", "selective")


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """Which automatic hooks are installed."""

    mode: str
    dataloader: bool
    forward: bool
    backward: bool
    optimizer: bool
    h2d: bool
    collectives: bool = False
    """Time collectives: DDP's gradient all-reduce and ``torch.distributed`` calls inside a step."""


def capture_config(
    mode: str, patches: dict[str, bool | None], collectives: bool | None = None
) -> CaptureConfig:
    """Validate ``init()``'s mode and ``patch_*`` arguments.

    Collective timing is on in ``auto`` mode and off otherwise, unless ``collectives`` says.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    given = {name: value for name, value in patches.items() if value is not None}
    if mode != "selective":
        if given:
            raise ValueError(
                f"patch_* arguments need mode='selective' (got mode={mode!r} with {sorted(given)})"
            )
        on = mode == "auto"
        return CaptureConfig(mode, *([on] * 5), collectives=on if collectives is None else collectives)
    if not any(given.values()):
        raise ValueError("mode='selective' needs at least one patch_*=True")
    return CaptureConfig(mode, *(bool(patches.get(name)) for name in
                                 ("dataloader", "forward", "backward", "optimizer", "h2d")),
                         collectives=bool(collectives))


def config_difference(before: tuple[CaptureConfig, bool], now: tuple[CaptureConfig, bool]) -> str:
    """``mode: 'auto' then 'manual'; disabled: False then True`` for the fields that differ."""
    fields = tuple(field.name for field in dataclasses.fields(CaptureConfig))  # every field, none forgotten
    names = {name: name if name in ("mode", "collectives") else f"patch_{name}" for name in fields}
    parts = [
        f"{names[name]}: {getattr(before[0], name)!r} then {getattr(now[0], name)!r}"
        for name in fields
        if getattr(before[0], name) != getattr(now[0], name)
    ]
    if before[1] != now[1]:
        parts.append(f"disabled: {before[1]!r} then {now[1]!r}")
    return "; ".join(parts) or "the same settings spelled differently"
