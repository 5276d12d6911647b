"""``manifest.json`` and ``rank-R.export.json``: one record each, written and read back the same way;
older files still read, newer ones read with a note, corrupt or hostile ones reported, never a crash."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel import contract as c
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.launch.export_report import render_export_report
from traceml_otel.launch.launcher import save_manifest
from traceml_otel.wire.export_stats import (
    EXPORT_STATS_VERSION,
    ExportStats,
    encode_export_stats,
    read_export_stats,
)
from traceml_otel.wire.manifest import MANIFEST_VERSION, Manifest, read_manifest, write_manifest

STORED_RUN = Path(__file__).resolve().parents[1] / "data" / "stored-run"

HOSTILE = {
    "not json": b"{not json",
    "an array": b"[1, 2]",
    "1e400": b'{"run_id": "x", "rank": 1e400, "world_size": 1e400, "start_time": 1e400}',
    "deep nesting": b'{"run_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "invalid utf-8": b'{"run_id": "\xff\xfe"}',
    "larger than 1 MiB": b'{"run_id": "' + b"x" * (2 << 20) + b'"}',
}


def test_a_manifest_reads_back_as_written(tmp_path: Path) -> None:
    manifest = Manifest(run_id="r1", run_name="train", command=("train.py", "--lr", "0.1"),
                        launcher=("torch.distributed.run", "--nproc-per-node=2"), world_size=2, nnodes=1,
                        node_rank=0, start_time=1.5, end_time=9.25, exit_code=3, end_status="exit code 3")
    write_manifest(tmp_path, manifest)
    on_disk = json.loads((tmp_path / c.MANIFEST_FILE).read_text())
    assert on_disk["manifest_version"] == MANIFEST_VERSION
    assert on_disk["launcher"][0] == "torch.distributed.run"
    read = read_manifest(tmp_path)
    assert read.problem is None and read.manifest == manifest


def test_an_older_manifest_reads_and_the_unwritten_exit_status_key_is_not_read(tmp_path: Path) -> None:
    (tmp_path / c.MANIFEST_FILE).write_text(json.dumps(
        {"run_id": "old", "command": "python train.py", "world_size": 2, "exit_status": 4}))
    read = read_manifest(tmp_path)
    assert read.problem is None and read.manifest is not None
    assert read.manifest.version == 1 and read.manifest.command == ("python", "train.py")
    assert read.manifest.exit_code is None  # no writer writes exit_status; the reader no longer guesses


def test_a_newer_manifest_is_read_with_a_clear_note(tmp_path: Path) -> None:
    (tmp_path / c.MANIFEST_FILE).write_text(json.dumps(
        {"manifest_version": MANIFEST_VERSION + 1, "run_id": "future", "world_size": 4, "new_field": {}}))
    read = read_manifest(tmp_path)
    assert read.manifest is not None and read.manifest.run_id == "future" and read.manifest.world_size == 4
    assert read.problem is not None and f"version {MANIFEST_VERSION + 1} is newer" in read.problem


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_corrupt_manifest_is_reported_and_the_run_still_analysed(tmp_path: Path, name: str) -> None:
    steps = [SyntheticStep(rank=0, step=s, forward=0.01) for s in range(30)]
    run = write_run(tmp_path / "run", "hostile", steps)
    (run / c.MANIFEST_FILE).write_bytes(HOSTILE[name])
    read = read_manifest(run)
    if read.manifest is None:
        assert read.problem is not None and "manifest ignored" in read.problem and str(run) in read.problem
        analysis = analyze_path([run])
        assert analysis.run.run_id == "hostile" and analysis.run.steps_read == 30
        assert any("manifest ignored" in w for w in analysis.run.warnings)
    else:  # 1e400 is valid JSON: the record reads with the impossible numbers left unset
        assert read.manifest.world_size is None and read.manifest.start_time is None


def test_the_manifest_writer_refuses_a_link_planted_at_its_temporary_file(tmp_path: Path, capsys) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / (c.MANIFEST_FILE + ".tmp")).symlink_to(target)
    assert save_manifest(tmp_path, Manifest(run_id="r")) is False  # said, not raised
    assert target.read_text() == "keep"
    assert "traceml: cannot write" in capsys.readouterr().err


def test_export_statistics_read_back_as_the_emitter_writes_them(tmp_path: Path) -> None:
    stats = ExportStats(run_id="r", rank=3, steps_received=10, spans_local=40, steps_local=9, steps_traced=10,
                        local_copy_complete=False, local_copy_closed_unix=12.5, capture_dropped_steps=1,
                        otlp_endpoint="http://127.0.0.1:4318", otlp_exported=30, otlp_dropped=10,
                        otlp_drop_reasons={"export failed": 10}, otlp_last_error="connection refused",
                        metrics_endpoint="http://127.0.0.1:4318", metric_exports=2, metric_export_failures=1,
                        metric_last_error="timeout", metric_values_rejected=4,
                        outputs_disabled={"local copy": "disk full"}, clean_shutdown=True, end_status="ok",
                        problems=["p"], final=True)
    (tmp_path / c.export_stats_file_name(3)).write_text(encode_export_stats(stats) + " " * 100)  # padded
    read = read_export_stats(tmp_path)
    assert read.problems == () and read.stats == (stats,)
    assert json.loads(encode_export_stats(stats))["export_stats_version"] == EXPORT_STATS_VERSION


def test_the_stored_version_1_statistics_read_with_their_field_names() -> None:
    read = read_export_stats(STORED_RUN)
    (stats,) = read.stats
    assert read.problems == () and stats.version == 1
    assert stats.rank == 0 and stats.steps_received == 60 and stats.spans_local == 240 and stats.final
    assert stats.metric_values_rejected == 0  # a field added later: absent from this file, read as 0


def test_corrupt_newer_and_foreign_statistics_files(tmp_path: Path) -> None:
    good = ExportStats(run_id="r", rank=0, steps_received=5, final=True)
    (tmp_path / c.export_stats_file_name(0)).write_text(encode_export_stats(good))
    newer = json.loads(encode_export_stats(replace(good, rank=1)))
    newer["export_stats_version"] = EXPORT_STATS_VERSION + 1
    (tmp_path / c.export_stats_file_name(1)).write_text(json.dumps(newer))
    for rank, name in ((2, "deep nesting"), (3, "1e400"), (4, "not json")):
        (tmp_path / c.export_stats_file_name(rank)).write_bytes(HOSTILE[name])
    (tmp_path / "rank-05.export.json").write_text(encode_export_stats(replace(good, rank=5)))  # not our name
    (tmp_path / "rank-6.export.json.tmp").write_text(encode_export_stats(replace(good, rank=6)))
    read = read_export_stats(tmp_path)
    assert [s.rank for s in read.stats] == [0, 1]
    problems = "\n".join(read.problems)
    assert "version 2 is newer" in problems
    for rank in (2, 3, 4):
        assert c.export_stats_file_name(rank) in problems
    account = render_export_report(tmp_path)
    assert "10 steps" in account and "2 rank(s)" in account


def test_the_launcher_account_shows_failed_metric_exports(tmp_path: Path) -> None:
    stats = ExportStats(run_id="r", rank=1, metrics_endpoint="http://127.0.0.1:9", metric_exports=3,
                        metric_export_failures=2, metric_last_error="connection refused", final=True,
                        clean_shutdown=True, end_status="ok")
    (tmp_path / c.export_stats_file_name(1)).write_text(encode_export_stats(stats))
    account = render_export_report(tmp_path)
    assert "OTLP metrics to http://127.0.0.1:9: 3 exports delivered, 2 failed" in account
    assert "rank 1: 2 metric exports failed (connection refused)" in account


def test_the_wire_package_imports_only_the_standard_library_the_contract_and_records() -> None:
    """``step_records`` (the step records the step row decodes into), ``sanitize`` (control characters
    out of what a record quotes) and ``errors`` (the error root) import only the standard library too."""
    wire = Path(__file__).resolve().parents[2] / "traceml_otel" / "wire"
    for module in wire.glob("*.py"):
        for line in module.read_text().splitlines():
            if line.startswith(("import ", "from ")) and "traceml_otel" in line:
                allowed = ("from traceml_otel.contract", "from traceml_otel.wire",
                           "from traceml_otel.step_records ", "from traceml_otel.sanitize ",
                           "from traceml_otel.errors ")
                assert line.startswith(allowed), (module, line)


def test_rank_files_are_found_by_their_contract_names(tmp_path: Path) -> None:
    from traceml_otel.analyze.sources.files import rank_trace_files

    for name in (c.traces_file_name(10), c.traces_file_name(2), "rank-02.traces.jsonl", "rank-x.traces.jsonl",
                 "notes.jsonl", c.export_stats_file_name(2)):
        (tmp_path / name).write_text("")
    assert [p.name for p in rank_trace_files(tmp_path)] == [c.traces_file_name(2), c.traces_file_name(10)]
    assert c.rank_of_file(c.export_stats_file_name(7), c.export_stats_file_name) == 7
    assert c.rank_of_file(c.traces_file_name(7), c.export_stats_file_name) is None
