"""The "where the job's time went" table reads as one table: every line's seconds in one column."""

from __future__ import annotations

from types import SimpleNamespace

from traceml_otel.analyze.time_accounting import TimeAccount
from traceml_otel.report.time_section import time_text


def test_a_long_category_label_does_not_push_its_numbers_out_of_the_column() -> None:
    categories = (("startup", 3.39), ("step.forward", 0.05), ("telemetry", 0.02),
                  ("outside.a_very_long_user_named_block_for_evaluation", 0.4), ("shutdown", 0.72))
    account = TimeAccount(wall_s=4.58, categories=categories, goodput=0.01, ranks=())
    lines = time_text(SimpleNamespace(time_account=account, mfu=None))
    rows = [line for line in lines if line.endswith("%")]
    assert len(rows) == len(categories)
    assert len({line.index(" s  ") for line in rows}) == 1, "\n".join(rows)
    assert any("telemetry (final export, linger)" in line for line in rows)
