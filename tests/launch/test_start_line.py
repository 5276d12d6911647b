"""The start line: once per job on every launch path, endpoints without credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from traceml_otel.launch.start_line import direct_launch_prints, start_line
from traceml_otel.settings import load_settings

REPO = Path(__file__).resolve().parents[2]


def test_endpoints_without_credentials() -> None:
    env = {"TRACEML_RUN_ID": "run-1", "TRACEML_RUNS_DIR": "/data/runs",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "https://alice:hunter22@otlp.example:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer s3cr3t-token",
           "TRACEML_PROMETHEUS_PORT": "9464"}
    line = start_line(load_settings(env), env)
    assert line.startswith("traceml: run run-1 | folder /data/runs/run-1")
    assert "hunter22" not in line and "s3cr3t" not in line and "otlp.example:4318" in line
    assert "Prometheus http://127.0.0.1:9464/metrics" in line
    assert "traceml top /data/runs/run-1" in line and "traceml analyze /data/runs/run-1" in line


def test_who_prints_in_a_direct_launch() -> None:
    base = {"TRACEML_RUN_ID": "r"}
    assert direct_launch_prints(load_settings(base), base)
    for extra in ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, {"TORCHELASTIC_RESTART_COUNT": "1"},
                  {"TRACEML_LAUNCHER": "traceml-run"}):
        env = {**base, **extra}
        assert not direct_launch_prints(load_settings(env), env), extra


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), TRACEML_AUTO="1")
    return env


def test_direct_torchrun_launch_prints_it_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(REPO / "tests" / "launch" / "scripts" / "live_ddp.py"), "5", "0.0"],
        env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("traceml: run ")]
    assert len(lines) == 1, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"folder {run_dir}" in lines[0] and f"traceml top {run_dir}" in lines[0]
    assert (run_dir / "rank-0.live.json").is_file() and (run_dir / "rank-1.live.json").is_file()
