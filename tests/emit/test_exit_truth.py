"""Exit truth on the metric path: a rank that ends with ``sys.exit(1)`` reports
``traceml_run_exit{traceml_exit_status="exception"}``, never ``clean`` (real 2-rank job under
``traceml run``, each rank's scrape endpoint read while it lingers after the end)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port_pair
from traceml_otel.emit.run_end import exit_of
from traceml_otel.wire.export_stats import read_export_stats_file

REPO = Path(__file__).resolve().parents[2]
EXIT = re.compile(r"^traceml_run_exit\{([^}]*)\}", re.M)


def test_exit_code_maps_to_a_failure() -> None:
    assert exit_of("exit 1") == ("exception", "SystemExit")
    assert exit_of("exit 2") == ("exception", "SystemExit")
    assert exit_of("ok") == ("clean", "")


def _scrape(port: int, seen: dict[int, tuple[str, str]], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read(4 << 20).decode()
            match = EXIT.search(text)
            if match:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
                seen[port] = (labels["traceml_exit_status"], labels["traceml_exit_reason"])
        except OSError:
            pass
        time.sleep(0.1)


def test_sys_exit_1_on_every_rank_is_not_clean(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import traceml_otel as traceml
        traceml.init()
        model = torch.nn.Linear(4, 1)
        for _ in range(20):
            with traceml.trace_step(model):
                model(torch.ones(8, 4)).sum().backward()
        print("trained", flush=True)
        sys.exit(1)
    """))
    port = free_port_pair()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S="6")
    seen: dict[int, tuple[str, str]] = {}
    stop = threading.Event()
    scrapers = [threading.Thread(target=_scrape, args=(p, seen, stop), daemon=True) for p in (port, port + 1)]
    for thread in scrapers:
        thread.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "traceml_otel.cli", "run", "--run-id", "exits", "--nproc-per-node", "2",
             str(script)],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
        )
    finally:
        stop.set()
        for thread in scrapers:
            thread.join(timeout=5)
    assert result.returncode != 0, result.stdout + result.stderr
    assert result.stdout.count("trained") == 2, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "exits"
    for rank in (0, 1):
        stats = read_export_stats_file(run_dir / f"rank-{rank}.export.json")
        assert stats.end_status == "exit 1", stats
    assert seen == {port: ("exception", "SystemExit"), port + 1: ("exception", "SystemExit")}, seen


def test_a_direct_launchs_manifest_has_the_sys_exit_code(tmp_path: Path) -> None:
    """A plain ``python script.py`` run (rank 0 writes the manifest): sys.exit(2) is exit code 2."""
    import json

    script = tmp_path / "direct.py"
    script.write_text("import sys\nimport traceml_otel as traceml\ntraceml.init()\nsys.exit(2)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), TRACEML_RUN_ID="direct")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    manifest = json.loads((tmp_path / "runs" / "direct" / "manifest.json").read_text())
    assert manifest["exit_code"] == 2 and manifest["exception_type"] == "SystemExit", manifest
