"""The type checker's baseline only shrinks.

CI runs mypy on traceml_otel/ (``.ci/run``; settings in pyproject.toml, ``[tool.mypy]``). The errors it
still found when it was added are switched off module by module (``disable_error_code``); typing a
module takes it off, and no module may join.
"""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

BASELINE = frozenset({
    "traceml_otel._api",
    "traceml_otel.analyze.assembler",
    "traceml_otel.analyze.columnar",
    "traceml_otel.analyze.compare_noise",
    "traceml_otel.analyze.compare_policy",
    "traceml_otel.analyze.compare_sides",
    "traceml_otel.analyze.evidence",
    "traceml_otel.analyze.independent",
    "traceml_otel.analyze.measures",
    "traceml_otel.analyze.otlp_decode",
    "traceml_otel.analyze.sources.otlp_json",
    "traceml_otel.analyze.sources.prometheus",
    "traceml_otel.analyze.sources.step_table",
    "traceml_otel.analyze.sources.tempo",
    "traceml_otel.capture.accelerate_hooks",
    "traceml_otel.capture.capture_config",
    "traceml_otel.capture.collectives",
    "traceml_otel.capture.copy_safe",
    "traceml_otel.capture.forward_hooks",
    "traceml_otel.capture.inferred_steps",
    "traceml_otel.capture.optimizer_hooks",
    "traceml_otel.capture.process_hooks",
    "traceml_otel.capture.recorder",
    "traceml_otel.capture.session_end",
    "traceml_otel.emit.channel",
    "traceml_otel.emit.exposed_communication",
    "traceml_otel.emit.live_state",
    "traceml_otel.emit.live_summary",
    "traceml_otel.emit.local_copy",
    "traceml_otel.emit.metric_merge",
    "traceml_otel.emit.prometheus_scrape",
    "traceml_otel.emit.span_export",
    "traceml_otel.emit.spans",
    "traceml_otel.emit.step_columns",
    "traceml_otel.emit.step_lines",
    "traceml_otel.emit.step_metrics",
    "traceml_otel.emit.step_table",
    "traceml_otel.report",
    "traceml_otel.report.events_section",
    "traceml_otel.stack.render",
    "traceml_otel.wire.hang_record",
})


def _relaxed_modules() -> set[str]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["mypy"]
    return {
        module
        for override in config.get("overrides", [])
        if override.get("disable_error_code")
        for module in override["module"]
    }


def test_no_module_joins_the_relaxed_list() -> None:
    assert _relaxed_modules() - BASELINE == set()


def test_the_checker_is_strict_enough_to_mean_something() -> None:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["files"] == ["traceml_otel"]
    assert config["check_untyped_defs"] and config["warn_unused_ignores"] and config["strict_equality"]
    public = next(o for o in config["overrides"] if o.get("disallow_untyped_defs"))
    assert {"traceml_otel._api", "traceml_otel.settings", "traceml_otel.wire.*"} <= set(public["module"])
    assert not any("syntax" in o.get("disable_error_code", ()) for o in config["overrides"])
