"""No planted link is followed (issue 21): report files, the run folder, and the end-of-run diagnosis's
memory budget, which keeps the launcher alive whatever the run folder holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.cli.analyze import diagnose_run_directory
from traceml_otel.cli.run_diagnosis import diagnose_in_child
from traceml_otel.emit.local_copy import LocalCopyWriter
from traceml_otel.launch.export_report import render_export_report
from traceml_otel.settings import diagnosis_memory_mb
from traceml_otel.wire.manifest import Manifest, write_manifest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run-a", "run-a", [SyntheticStep(rank=0, step=n) for n in range(20)])


def test_planted_links_at_report_files_are_refused_and_the_victims_untouched(run_dir: Path,
                                                                            tmp_path: Path) -> None:
    victims = {name: tmp_path / f"victim-{name}" for name in ("report.json", "report.html")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (run_dir / name).symlink_to(victim)
    text = diagnose_run_directory(run_dir, html=True)
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n"
        assert (run_dir / name).is_symlink()
        assert f"Report: not written to {run_dir / name} (OSError: {run_dir / name} is a symbolic link; " \
               "not followed (planted?))" in text
    assert text.startswith("traceml-otel diagnosis")  # the diagnosis itself still printed


def test_reports_are_still_written_and_replaced_normally(run_dir: Path) -> None:
    diagnose_run_directory(run_dir, html=True)
    diagnose_run_directory(run_dir, html=True)
    assert json.loads((run_dir / "report.json").read_text())["run"]["run_id"] == "run-a"
    assert not list(run_dir.glob("*.tmp"))


def test_a_link_planted_at_the_run_folder_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = tmp_path / "runs" / "run-b"
    planted.parent.mkdir()
    planted.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link; not followed"):
        write_manifest(planted, Manifest(run_id="run-b"))
    with pytest.raises(OSError, match="symbolic link; not followed"):
        LocalCopyWriter(planted / "rank-0.traces.jsonl", None, None)  # type: ignore[arg-type]
    assert diagnose_run_directory(planted).startswith(f"traceml: no diagnosis: {planted} is a symbolic link")
    assert "is a symbolic link (planted?); nothing was written or read through it" in \
        render_export_report(planted)
    assert list(victim.iterdir()) == []


def test_the_end_of_run_diagnosis_has_a_memory_budget(run_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACEML_DIAGNOSIS_MEMORY_MB", "30")  # far below what Python needs to analyse
    assert diagnosis_memory_mb() == 30
    text = diagnose_in_child(run_dir, html=False)
    assert text.startswith("traceml: no diagnosis: it needed more than its memory budget of 30 MiB "
                           "(TRACEML_DIAGNOSIS_MEMORY_MB)"), text
    monkeypatch.delenv("TRACEML_DIAGNOSIS_MEMORY_MB")
    assert diagnosis_memory_mb() >= 2048
    assert diagnose_in_child(run_dir, html=False).startswith("traceml-otel diagnosis")
