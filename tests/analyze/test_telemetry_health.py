"""The diagnosis admits what the emitters' export statistics say: outputs turned off (with rank,
output and reason), an incomplete local copy (which also lowers the verdict's severity), and data
OTLP did not deliver. Real emitters write the run directories here; a backend source says nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.emit.test_emitter_faults import _hello as emitter_hello
from tests.faulty_disk import read_only_dir
from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel import contract as c
from traceml_otel.analyze import analyze_path
from traceml_otel.analyze.kinds import RunKind, Severity
from traceml_otel.emit.worker import Emitter
from traceml_otel.report import render
from traceml_otel.wire.export_stats import ExportStats, encode_export_stats
from traceml_otel.wire.hello import Hello
from traceml_otel.wire.step_row import PhaseRow, StepRow


def _rows(first: int, count: int) -> list[StepRow]:
    rows = []
    for step in range(first, first + count):
        start = step * 40_000_000 + 30_000_000  # after 30 ms of input wait: an input-bound run
        phases = [PhaseRow.timed("forward", 0, start + 1_000_000, start + 6_000_000, None)]
        rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + 9_000_000,
                               input_wait_ns=30_000_000, input_fetches=1, optimizer_steps=1,
                               phases=phases))
    return rows


def _hello(run_dir: Path, rank: int) -> Hello:
    return emitter_hello(run_dir, rank=rank, local_rank=rank, world_size=2)


def _degraded(analysis):
    found = [f for f in analysis.run_findings if f.kind == RunKind.TELEMETRY_DEGRADED]
    assert len(found) <= 1
    return found[0] if found else None


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_full_disk_on_rank_1_is_named_and_lowers_the_verdict(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    healthy, full = Emitter(_hello(run, 0)), Emitter(_hello(run, 1))
    healthy.handle_steps(_rows(0, 60))
    full.handle_steps(_rows(0, 40))
    assert full.local is not None
    os.close(full.local._fd)
    full.local._fd = os.open("/dev/full", os.O_WRONLY)  # every later write: ENOSPC, from the kernel
    full.handle_steps(_rows(40, 20))
    for emitter in (healthy, full):
        emitter.finish("ok", 0, True, steps_traced=60)
    analysis = analyze_path([run])
    finding = _degraded(analysis)
    assert finding is not None and finding.severity is Severity.WARNING
    assert "rank 1: local copy turned off" in finding.why and "No space left" in finding.why
    assert "rank 1: the local copy holds 40 of 60 traced steps" in finding.why
    assert "rank 0" not in finding.title
    assert "incomplete local copy (rank 1 40 of 60 traced steps written)" in analysis.step.caps
    assert analysis.step.primary.kind == "INPUT_BOUND" and analysis.step.primary.severity is Severity.WARNING
    text, html = _flat(render(analysis, "text")), render(analysis, "html")
    report = json.loads(render(analysis, "json"))
    assert "TELEMETRY DEGRADED [warning] - rank 1: telemetry outputs" in text
    assert "severity capped at warning" in text and "incomplete local copy" in text
    (entry,) = [f for f in report["run_findings"] if f["kind"] == "TELEMETRY_DEGRADED"]
    assert "No space left" in entry["why"]
    assert any("incomplete local copy" in cap for cap in report["severity_caps"])
    assert "TELEMETRY DEGRADED" in html and "rank 1: local copy turned off" in html


def test_a_read_only_local_copy_on_one_rank_is_named(tmp_path: Path) -> None:
    with read_only_dir(tmp_path / "readonly") as readonly:
        emitter = Emitter(_hello(readonly, 1))  # the real emitter, on a real read-only folder
        emitter.handle_steps(_rows(0, 30))
        emitter.finish("ok", 0, True, steps_traced=30)
    assert "local copy" in emitter.stats.outputs_disabled
    steps = [SyntheticStep(rank=0, step=n, world_size=2) for n in range(30)]
    run = write_run(tmp_path / "run", "r", steps)
    # What rank 1 could not write itself, as a collecting job would gather it beside the others.
    (run / c.export_stats_file_name(1)).write_text(encode_export_stats(emitter.stats))
    analysis = analyze_path([run])
    finding = _degraded(analysis)
    assert finding is not None and finding.severity is Severity.WARNING
    why = finding.why
    assert "rank 1: local copy turned off (cannot open it in" in why and "Read-only file system" in why
    assert "rank 1: the local copy holds 0 of 30 traced steps" in why
    assert [f.kind for f in analysis.run_findings][:1] == [RunKind.MISSING_RANKS]


def test_otlp_losses_alone_are_information_and_cap_nothing(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n) for n in range(30)]
    run = write_run(tmp_path / "run", "r", steps)
    stats = ExportStats(run_id="r", rank=0, steps_received=30, steps_local=30, steps_traced=30,
                        local_copy_complete=True, otlp_endpoint="http://collector:4318", otlp_dropped=60,
                        otlp_drop_reasons={"export failed": 60}, metrics_endpoint="http://collector:4318",
                        metric_exports=1, metric_export_failures=3, metric_last_error="connection refused",
                        metric_values_rejected=4, clean_shutdown=True, end_status="ok", final=True)
    (run / c.export_stats_file_name(0)).write_text(encode_export_stats(stats))
    analysis = analyze_path([run])
    finding = _degraded(analysis)
    assert finding is not None and finding.severity is Severity.INFO
    assert "60 spans were not delivered over OTLP to http://collector:4318 (export failed: 60)" in finding.why
    assert "3 of 4 OTLP metric exports to http://collector:4318 failed (connection refused)" in finding.why
    assert "rank 0: 4 measurements not finite or negative" in finding.why
    assert ("rank_0_metric_values_rejected", 4) in [(e.name, e.value) for e in finding.evidence]
    assert not any("local copy" in cap for cap in analysis.step.caps)


def test_healthy_statistics_another_runs_leftovers_and_span_files_say_nothing(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=0, step=n) for n in range(30)]
    run = write_run(tmp_path / "run", "r", steps)
    clean = ExportStats(run_id="r", rank=0, steps_received=30, steps_local=30, steps_traced=30,
                        local_copy_complete=True, clean_shutdown=True, end_status="ok", final=True)
    (run / c.export_stats_file_name(0)).write_text(encode_export_stats(clean))
    other = ExportStats(run_id="another-run", rank=1, outputs_disabled={"local copy": "x"}, final=True)
    (run / c.export_stats_file_name(1)).write_text(encode_export_stats(other))
    assert _degraded(analyze_path([run])) is None
    broken = ExportStats(run_id="r", rank=0, outputs_disabled={"Prometheus endpoint": "busy"}, final=True)
    (run / c.export_stats_file_name(0)).write_text(encode_export_stats(broken))
    assert _degraded(analyze_path([run])) is not None
    # Span files named directly (as spans from Tempo or Jaeger): no run directory, no statistics read.
    assert _degraded(analyze_path([run / c.traces_file_name(0)])) is None
