"""What a training session needs of the link to its emitter and of the run manifest: the interfaces
``emit/channel.py`` and ``launch/direct.py`` fill (capture never imports emit)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from traceml_otel.wire.control import LocalReport


class EmitterLink(Protocol):
    """What the session needs of the channel to its emitter (``emit/channel.py``'s ``EmitterChannel``)."""

    steps_offered: int
    steps_handed: int
    dropped_steps: int
    broken: str | None
    local_report: LocalReport | None

    def send_steps(self, rows: list[Any]) -> None: ...

    def close(self, timeout_s: float, status: str = "ok", traced: int | None = None,
              stall_s: float = ...) -> bool: ...

    def emitter_fate(self) -> str: ...

    def detach(self) -> None: ...


class Finishable(Protocol):
    """The run manifest a direct launch's rank 0 writes (``launch/direct.py``)."""

    def finish(self, status: str) -> None: ...
