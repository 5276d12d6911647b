"""Which collectives a rank entered, per process group, readable while the training thread is blocked.

The recorder already holds the rest of a rank's progress state (step number, whether a step is
open, its completed phases, ``outside_step`` blocks) in plain attributes that the hang watchdog
reads from its own thread. What it lacks is a sequence number per process group that every rank
counts the same way: :class:`CollectiveProgress` counts each collective the capture hooks see (in a
step or not) and keeps the ones still in flight. The cost is one dict update and one list append
and remove per collective call (not per step). List and dict operations are atomic under the GIL,
so the watchdog thread reads a consistent snapshot without a lock.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

DEFAULT_GROUP = "default"
"""Name used for the default (world) process group."""


def group_name(group: Any) -> str:
    """A process group's name, the same on every rank (c10d names groups in creation order)."""
    if group is None:
        return DEFAULT_GROUP
    try:
        from torch.distributed import distributed_c10d

        if group is distributed_c10d._get_default_group():
            return DEFAULT_GROUP
    except Exception:
        pass
    name = getattr(group, "group_name", None)
    if isinstance(name, str) and name:
        return name
    return "unnamed"


class CollectiveProgress:
    """Per-group collective counters and the collectives in flight.

    An in-flight entry is ``[kind, group, seq, start_ns, source]``.
    """

    __slots__ = ("entered", "open")

    def __init__(self) -> None:
        self.entered: dict[str, int] = {}
        """Process group name -> how many collectives this rank entered on it (the last sequence number)."""
        self.open: list[list[Any]] = []
        """Collectives entered and not completed, oldest first."""

    def enter(self, kind: str, group: str, source: str) -> list[Any]:
        """Count a collective on ``group`` and mark it in flight; returns the entry for :meth:`leave`."""
        seq = self.entered.get(group, 0) + 1
        self.entered[group] = seq
        entry = [kind, group, seq, perf_counter_ns(), source]
        self.open.append(entry)
        return entry

    def leave(self, entry: list[Any]) -> None:
        """The collective completed (from whichever thread saw it)."""
        try:
            self.open.remove(entry)
        except ValueError:
            pass

    def snapshot(self) -> tuple[dict[str, int], list[list[Any]]]:
        """Copies of the counters and of the in-flight list, for another thread."""
        return dict(self.entered), list(self.open)
