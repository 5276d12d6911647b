"""The columnar engine: the step tables hold what the spans hold, and DuckDB's SQL gives the span
reader's diagnosis; an incomplete table is never read as complete.

Runs are written by the emitter's own writers (``tests/synthetic_runs.py``: span builder, local copy,
step table). Parity on the real diagnosis scenarios is in ``test_prometheus_parity.py`` (same runs).
DuckDB is a test dependency: missing, these tests fail under CI (``CI`` set) and skip elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import SourceError, analyze_path, engine_choice
from traceml_otel.analyze.run_model import WindowSpec
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.analyze.sources.step_table import check_tables, load_tables, step_timing
from traceml_otel.emit.step_table import StepTable
from traceml_otel.report import render
from traceml_otel.wire.step_table import COLUMNS, read_table_record, table_file_name, table_record_name

HAVE_DUCKDB = importlib.util.find_spec("duckdb") is not None


@pytest.fixture(autouse=True)
def _duckdb() -> None:
    if not HAVE_DUCKDB:
        message = "duckdb is not installed (pip install -e '.[test]' or '.[columnar]')"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run the columnar tests", pytrace=False)
        pytest.skip(message)


def _mixed_steps() -> list[SyntheticStep]:
    """Two DDP ranks exercising every branch: GPU clocks, collectives inside backward, prefetch and
    in-step copies, two forward calls, loader settings, samples, a failed step, memory peaks."""
    steps = []
    for rank in range(2):
        for number in range(60):
            steps.append(SyntheticStep(
                rank=rank, step=number, world_size=2, parallelism="ddp", gpu=True,
                input_wait=0.001 + 0.01 * (rank == 1), forward_calls=2 if number % 7 == 0 else 1,
                ddp_wait=0.002 if number % 2 else 0.0005, h2d=0.0002, prefetch_h2d=0.0001,
                peak_allocated=1000 + 10 * number, peak_reserved=4000 + number, memory_total=1 << 20,
                samples=8, tokens=None if number % 3 else 512,
                num_workers=2 if number == 0 else None, batch_size=8, prefetch_factor=2, dataset="Toy",
                error="ValueError" if (rank == 0 and number == 37) else None,
            ))
    return steps


def _uneven_steps() -> list[SyntheticStep]:
    """CPU only: a rank missing its input wait on some steps, one rank 5 steps short, no optimizer
    on micro-steps, a rank with no backward on one step."""
    steps = []
    for rank in range(3):
        for number in range(50 - 5 * (rank == 2)):
            steps.append(SyntheticStep(
                rank=rank, step=number, world_size=3, input_wait=None if (rank == 1 and number % 9 == 0)
                else 0.002, optimizer=None if number % 2 else 0.001, optimizer_steps=int(number % 2 == 0),
                backward=None if (rank == 0 and number == 20) else 0.006 + 0.002 * rank,
            ))
    return steps


def _stalled_steps() -> list[SyntheticStep]:
    """Two DDP ranks; at step 30 rank 1 makes no progress for 25 s (in its forward) while rank 0 waits
    for it in backward's gradient all-reduce: one stall, never a straggler."""
    steps = []
    for rank in range(2):
        for number in range(60):
            stuck = number == 30
            steps.append(SyntheticStep(
                rank=rank, step=number, world_size=2, parallelism="ddp",
                forward=25.0 if stuck and rank == 1 else 0.004,
                backward=25.008 if stuck and rank == 0 else 0.008,
                ddp_wait=25.0 if stuck and rank == 0 else 0.0005,
            ))
    return steps


def _segmented_steps() -> list[SyntheticStep]:
    """Two ranks: a slow compile (15 steps), a steady period, then a last third 40 % slower, its extra
    time outside the phases (residual): three segments, the steady one's verdict."""
    import random

    rnd = random.Random(5)
    steps = []
    for rank in range(2):
        for n in range(300):
            scale = 3.0 if n < 15 else 1.0
            extra = 0.0045 if n >= 200 else 0.0
            jitter = 1 + rnd.gauss(0, 0.03)
            steps.append(SyntheticStep(rank=rank, step=n, world_size=2, input_wait=0.0003,
                                       forward=0.004 * scale * jitter, backward=0.006 * scale * jitter,
                                       residual=0.0005 + extra))
    return steps


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("columnar")
    mixed = write_run(root / "mixed", "run-mixed", _mixed_steps(), cpus=4)
    uneven = write_run(root / "uneven", "run-uneven", _uneven_steps())
    stalled = write_run(root / "stalled", "run-stalled", _stalled_steps())
    segmented = write_run(root / "segmented", "run-segmented", _segmented_steps())
    return {"mixed": mixed, "uneven": uneven, "stalled": stalled, "segmented": segmented}


IN_TIME = ("noise",)
"""Report members the columnar engine does not compute (every other member, the segments, recurrence,
verdict and stalls included, must agree; ``noise`` is compare's, from the steps)."""


def in_time_removed(report: dict) -> dict:
    """``report`` less what only the span reader computes (``IN_TIME``)."""
    for key in IN_TIME:
        report.pop(key, None)
    return report


def _report(run_dir: Path, engine: str, **kwargs) -> dict:
    report = json.loads(render(analyze_path([run_dir], engine=engine, **kwargs), "json"))
    report.pop("generated_at", None)
    report["run"].pop("source", None)
    return in_time_removed(report)


def _assert_same(python: object, columnar: object, where: str = "") -> None:
    """Equal, floats to 1e-9 relative (the engines sum in another order)."""
    if isinstance(python, dict) and isinstance(columnar, dict):
        assert set(python) == set(columnar), where
        for key in python:
            _assert_same(python[key], columnar[key], f"{where}.{key}")
    elif isinstance(python, list) and isinstance(columnar, list):
        assert len(python) == len(columnar), where
        for index, (a, b) in enumerate(zip(python, columnar, strict=True)):
            _assert_same(a, b, f"{where}[{index}]")
    elif isinstance(python, float) and isinstance(columnar, float | int):
        assert columnar == pytest.approx(python, rel=1e-9, abs=1e-12), where
    else:
        assert python == columnar, where


def test_each_row_is_the_span_readers_record_of_that_step(runs: dict[str, Path], tmp_path: Path) -> None:
    for run_dir in runs.values():
        spans = {(s.rank, s.step): s for s in FileSpanSource([run_dir]).load().steps}
        check = check_tables(run_dir, sorted({rank for rank, _ in spans}))
        assert check.usable, check.problem
        con = load_tables(check, str(tmp_path))
        rows = [step_timing(row) for row in con.execute(f"SELECT {', '.join(COLUMNS)} FROM steps").fetchall()]
        con.close()
        assert len(rows) == len(spans)
        for row in rows:
            assert row == spans[(row.rank, row.step)]


@pytest.mark.parametrize(("name", "window"), [
    ("mixed", None), ("mixed", WindowSpec(last=20)), ("mixed", WindowSpec(first_step=10, last_step=30)),
    ("uneven", None), ("stalled", None), ("segmented", None)],
    ids=["mixed-run", "mixed-last-20", "mixed-range", "uneven-run", "stalled-run", "segmented-run"])
def test_the_engines_give_the_same_report(runs: dict[str, Path], name: str, window: WindowSpec | None,
                                          ) -> None:
    python = _report(runs[name], "python", window=window)
    columnar = _report(runs[name], "columnar", window=window)
    _assert_same(python, columnar)
    assert python["primary_diagnosis"]["kind"] != "NO_DATA"


def test_a_stall_is_an_event_in_both_engines_and_never_a_straggler(runs: dict[str, Path]) -> None:
    """The columnar engine finds the stall in SQL, names the stuck rank and leaves its step out of the
    per-step means, as the span reader does."""
    for engine in ("python", "columnar"):
        report = json.loads(render(analyze_path([runs["stalled"]], engine=engine), "json"))
        (event,) = report["stalls"]["events"]
        assert event["kind"] == "STALL" and event["ranks"] == [1] and event["step"] == 30, (engine, event)
        assert event["seconds"] == pytest.approx(25.0, abs=0.1)
        kinds = [report["primary_diagnosis"]["kind"], *(i["kind"] for i in report["issues"])]
        assert not any("STRAGGLER" in kind for kind in kinds), (engine, kinds)
        assert "STALL" in [f["kind"] for f in report["run_findings"]], (engine, report["run_findings"])


def test_a_second_run_written_into_the_folder_is_not_mistaken_for_a_complete_table(tmp_path: Path) -> None:
    """Both runs append to the same span file and table; the record is the last writer's."""
    run_dir = tmp_path / "two"
    write_run(run_dir, "run-a", [SyntheticStep(rank=0, step=n) for n in range(30)], manifest=False)
    write_run(run_dir, "run-b", [SyntheticStep(rank=0, step=n, input_wait=0.02) for n in range(40)],
              manifest=False)
    record = read_table_record(run_dir / table_record_name(0))
    assert (record.run_id, record.rows, record.complete) == ("run-b", 40, True)
    with pytest.raises(SourceError, match="rank 0: 70 rows read, 40 recorded"):
        analyze_path([run_dir], engine="columnar")


def test_auto_takes_the_columnar_engine_from_the_size_threshold(runs, monkeypatch) -> None:
    assert "columnar engine" not in analyze_path([runs["uneven"]]).run.source  # small: the span reader
    monkeypatch.setattr(engine_choice, "COLUMNAR_MIN_BYTES", 0)
    assert "columnar engine" in analyze_path([runs["uneven"]]).run.source


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / run_dir.name
    target.mkdir()
    for path in run_dir.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize("fault", ["no-record", "incomplete", "row-appended", "row-cut", "corrupt",
                                   "no-table", "huge"])
def test_an_incomplete_table_is_never_read_as_complete(runs, tmp_path, monkeypatch, fault: str) -> None:
    """auto reads the spans and says why; --engine columnar refuses with the reason."""
    run_dir = _copy(runs["uneven"], tmp_path)
    table, record = run_dir / table_file_name(1), run_dir / table_record_name(1)
    lines = table.read_text().splitlines(keepends=True)
    if fault == "no-record":  # the emitter died before closing it
        record.unlink()
    elif fault == "incomplete":
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "complete": False, "problem": "writing failed after 3 rows"}))
    elif fault == "row-appended":
        table.write_text("".join([*lines, lines[-1]]))
    elif fault == "row-cut":
        table.write_text("".join(lines[:-1]))
    elif fault == "huge":  # refused by its size before DuckDB reads a byte
        table.write_text("".join([*lines, "#" * (len(lines) * 8192), "\n"]))
    elif fault == "corrupt":
        table.write_text("".join([*lines[:5], "1,2,not,a,row\n", *lines[5:]]))
    else:
        table.unlink()
    monkeypatch.setattr(engine_choice, "COLUMNAR_MIN_BYTES", 0)
    analysis = analyze_path([run_dir])
    assert "columnar engine" not in analysis.run.source
    notes = [w for w in analysis.run.warnings if w.startswith("columnar engine not used")]
    assert len(notes) == 1 and ("rank 1" in notes[0] or fault == "corrupt"), notes
    auto = json.loads(render(analysis, "json"))
    auto.pop("generated_at")
    auto["run"].pop("source")
    auto["run"]["warnings"] = [w for w in auto["run"]["warnings"] if not w.startswith("columnar engine not")]
    auto["run"]["warnings_total"] -= 1
    _assert_same(_report(run_dir, "python"), in_time_removed(auto))
    with pytest.raises(SourceError, match=r"--engine columnar: .*use --engine python"):
        analyze_path([run_dir], engine="columnar")


def test_a_failed_write_turns_the_table_off_and_its_record_says_so(tmp_path: Path) -> None:
    from tests.synthetic_runs import START_NS, SyntheticRank

    said: list[str] = []
    rank = SyntheticRank("run-f", 0, 1)
    table = StepTable(tmp_path, "run-f", 0, said.append)
    built = [rank.build(SyntheticStep(rank=0, step=n), START_NS + n * 10**7) for n in range(6)]
    table.write(built[:3])
    os.close(table._writer._fd)  # the disk goes away under it
    table.write(built[3:])
    table.write(built[3:])
    table.close()
    record = read_table_record(tmp_path / table_record_name(0))
    assert (record.rows, record.complete) == (3, False)
    assert "writing failed after 3 rows" in record.problem
    assert len(said) == 1 and "step table turned off" in said[0]
    assert len((tmp_path / table_file_name(0)).read_text().splitlines()) == 4  # header + 3 whole rows


def test_the_cli_takes_the_engine_and_says_why_it_cannot(runs, tmp_path, capsys) -> None:
    from traceml_otel.cli.entry import main

    assert main(["analyze", str(runs["mixed"]), "--engine", "columnar", "--format", "json"]) == 0
    assert "columnar engine" in json.loads(capsys.readouterr().out)["run"]["source"]
    assert main(["analyze", str(runs["mixed"]), "--engine", "columnar", "--service", "x"]) == 2
    assert "no service name" in capsys.readouterr().err


def test_the_emitter_writes_a_complete_table_beside_its_spans(tmp_path: Path) -> None:
    """The real emitter, fed step rows as the trainer hands them: its table and spans read the same."""
    import time

    from traceml_otel.emit.worker import Emitter
    from traceml_otel.wire.hello import Hello
    from traceml_otel.wire.step_row import PhaseRow, StepRow

    hello = Hello(run_id="run-e", rank=0, local_rank=0, world_size=1, node_rank=0, host="h", pid=1,
                  anchor_ns=time.time_ns(), shutdown_timeout_s=5.0, service_name="svc-e",
                  run_dir=str(tmp_path))
    emitter = Emitter(hello)
    ms = 1_000_000
    for first in range(0, 40, 16):
        emitter.handle_steps([StepRow.of(
            step=n, start_ns=n * 2 * ms, end_ns=n * 2 * ms + ms, input_wait_ns=ms // 4, input_fetches=1,
            optimizer_steps=1, phases=[PhaseRow.timed("forward", 0, n * 2 * ms, n * 2 * ms + ms // 2, None)],
        ) for n in range(first, min(first + 16, 40))])
    emitter.finish("ok", 0, True, 40)
    record = read_table_record(tmp_path / table_record_name(0))
    assert (record.run_id, record.rows, record.complete, record.service) == ("run-e", 40, True, "svc-e")
    _assert_same(_report(tmp_path, "python"), _report(tmp_path, "columnar"))


def test_both_engines_cut_a_run_into_the_same_segments_and_take_the_steady_ones_verdict(
        runs: dict[str, Path]) -> None:
    """Segments are no longer the span reader's alone: the columnar engine (long runs) finds the
    compile, the steady period and the slow last third at the same steps, and its verdict is the
    steady segment's, never the whole run's average."""
    for engine in ("python", "columnar"):
        report = json.loads(render(analyze_path([runs["segmented"]], engine=engine), "json"))
        segments = report["segments"]["segments"]
        assert [s["label"] for s in segments] == ["warm-up", "steady", "slow period"], (engine, segments)
        assert abs(segments[2]["first_step"] - 200) <= 15, (engine, segments)
        steady = segments[report["segments"]["reference"]]
        assert report["primary_diagnosis"]["kind"] == steady["verdict"] == "COMPUTE_BOUND", engine
        assert segments[2]["verdict"] == "RESIDUAL_HEAVY", (engine, segments)
        assert report["drift"]["segment_steps"] is not None, engine


def _slow_rank_steps(slow_from: int) -> list[SyntheticStep]:
    """Two DDP ranks over 400 steps; from ``slow_from`` on, rank 1's forward is 6 ms slower and rank 0
    waits for it in backward (no measured collectives: the inferred straggler rule)."""
    steps = []
    for rank in range(2):
        for n in range(400):
            late = 0.006 if n >= slow_from else 0.0
            steps.append(SyntheticStep(rank=rank, step=n, world_size=2, parallelism="ddp",
                                       forward=0.004 + (late if rank == 1 else 0.0),
                                       backward=0.008 + (late if rank == 0 else 0.0)))
    return steps


@pytest.mark.parametrize("detail_rows", [None, 10], ids=["records", "grouped-sql"])
def test_both_engines_tell_a_chronic_straggler_from_a_transient_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, detail_rows: int | None) -> None:
    """Recurrence in the columnar engine: from the window's records, and (a window too large for them,
    forced here) from per-window SQL sums; both as the span reader's."""
    from traceml_otel.analyze import columnar

    if detail_rows is not None:
        monkeypatch.setattr(columnar, "DETAIL_ROWS", detail_rows)
    for slow_from, pattern in ((0, "chronic"), (360, "transient")):
        run_dir = write_run(tmp_path / f"slow-{slow_from}", f"run-{slow_from}", _slow_rank_steps(slow_from))
        found = {engine: analyze_path([run_dir], engine=engine).straggler_recurrence
                 for engine in ("python", "columnar")}
        assert found["python"] is not None and found["python"].pattern == pattern, found["python"]
        assert found["columnar"] == found["python"], found
