"""A recorder sink that keeps the step rows it is handed, for capture tests."""

from __future__ import annotations

from traceml_otel.step_records import StepRecord
from traceml_otel.wire.step_row import decode_step


class ListSink:
    """Stands in for the emitter channel: keeps every row, and decodes them as the emitter would."""

    def __init__(self) -> None:
        self.rows: list = []

    def send_steps(self, rows: list) -> None:
        self.rows.extend(rows)

    def records(self) -> list[StepRecord]:
        return [decode_step(row, 0) for row in self.rows]
