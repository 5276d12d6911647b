"""NaN and infinite numbers are bad data, said in one line; dropped series are counted and said; the
JSON report parses strictly (issue 38; ``compare``'s numbers are tested with ``compare``).

Real ``traceml analyze`` processes: against a local Prometheus-shaped server whose answers carry
ranks ``1e3`` and ``-5`` and a ``NaN``; on a run folder whose step table holds ``nan`` and whose
statistics file holds ``NaN``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.wire.step_table import table_file_name

REPO = Path(__file__).resolve().parents[2]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-strict JSON token {name}")

    return json.loads(text, parse_constant=refuse)


def _cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=180, check=False)


class _Hostile(BaseHTTPRequestHandler):
    """Every instant query: ranks 0 and 1 fine, rank 2 NaN, ranks ``1e3`` and ``-5`` (not rank numbers)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        now = time.time()
        if self.path.startswith("/api/v1/query_range"):
            data = {"resultType": "matrix", "result": [
                {"metric": {}, "values": [[now - 60, "5"], [now - 30, "NaN"], [now - 20, "9"]]}]}
        elif self.path.startswith("/api/v1/query_exemplars"):
            data = []
        else:
            data = {"resultType": "vector", "result": [
                {"metric": {"traceml_rank": rank}, "value": [now, value]}
                for rank, value in (("0", "10"), ("1", "10"), ("2", "NaN"), ("1e3", "10"), ("-5", "10"))]}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hostile_prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_dropped_prometheus_series_are_counted_and_said(hostile_prometheus: str, tmp_path: Path) -> None:
    done = _cli("analyze", "--prometheus", hostile_prometheus, "--run-id", "r", "--since", "10m",
                "--format", "json", "--output", str(tmp_path / "report.json"))
    assert done.returncode in (0, 1), done.stderr
    said = done.stderr.splitlines()
    assert "2 series dropped: non-numeric rank label (traceml_rank -5, 1e3)" in " ".join(said), done.stderr
    assert "1 series dropped: value not finite (NaN or Inf) (traceml_rank 2)" in " ".join(said)
    assert "samples of the series over the run dropped: value not finite (NaN or Inf)" in done.stderr
    report = _strict((tmp_path / "report.json").read_text())
    warnings = " ".join(report["run"]["warnings"])  # type: ignore[index]
    assert "2 series dropped: non-numeric rank label" in warnings
    assert report["run"]["ranks"] == [0, 1]  # type: ignore[index]


def test_a_nan_in_a_step_table_is_bad_data_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    run_dir = write_run(tmp_path / "run", "nan-run", [SyntheticStep(rank=r, step=n, world_size=2)
                                                      for r in range(2) for n in range(20)])
    table = run_dir / table_file_name(1)
    header, *rows = table.read_text().splitlines()
    column = header.split(",").index("traced_cpu")
    cells = rows[5].split(",")
    cells[column] = "nan"
    table.write_text("\n".join([header, *rows[:5], ",".join(cells), *rows[6:]]) + "\n")
    forced = _cli("analyze", str(run_dir), "--engine", "columnar")
    assert forced.returncode == 2 and forced.stdout == ""
    (line,) = forced.stderr.strip().splitlines()
    assert "rank 1's step table holds non-finite numbers (NaN or Inf) in 1 row(s): bad data" in line, line
    spans = _cli("analyze", str(run_dir), "--format", "json")  # the span reader: the spans are fine
    assert spans.returncode == 0 and _strict(spans.stdout)["run"]["steps_read"] == 40  # type: ignore[index]


def test_a_nan_in_a_rank_statistics_file_is_bad_data_and_the_json_stays_strict(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO), TRACEML_RUNS_DIR=str(runs), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", "--no-report", "--run-id", "n",
                           str(STEADY), "--steps", "12"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    stats = runs / "n" / "rank-0.export.json"
    text = stats.read_text()
    poisoned = text.replace('"steps_local": 12', '"steps_local": NaN', 1)
    assert poisoned != text
    stats.write_text(poisoned)
    analyzed = _cli("analyze", str(runs / "n"), "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr
    report = _strict(analyzed.stdout)
    said = [line for line in analyzed.stderr.splitlines() + report["run"]["warnings"]  # type: ignore[index]
            if "rank-0.export.json" in line]
    assert said and "non-finite number (NaN)" in said[0], analyzed.stderr
