"""A failing ``traceml run`` job watched from outside, as the first-failure tests watch it: the first
rank's scrape endpoint is polled for ``traceml_run_first_failure`` while the job runs (the ranks'
linger keeps it up after their end). Helpers, not tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIRST_FAILURE = "traceml_run_first_failure{"
"""The start of the metric's line on a scraped page."""


def scrape(port: int) -> str:
    """The page ``127.0.0.1:port/metrics`` serves; ``""`` while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return reply.read().decode()
    except OSError:
        return ""


def failing_job_env(tmp_path: Path, port: int, linger_s: int) -> dict[str, str]:
    """The environment of a job under ``tmp_path/runs``: no inherited OTel, traceml or torchelastic
    variables; the first rank's endpoint on ``port``, lingering ``linger_s`` after the rank ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_", "TORCHELASTIC_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               TRACEML_PROMETHEUS_PORT=str(port), TRACEML_PROMETHEUS_LINGER_S=str(linger_s),
               TRACEML_FLUSH_INTERVAL_MS="100")
    return env


@dataclass(frozen=True)
class WatchedJob:
    """How a job ended, and the first page its endpoint served with the first failure on it."""

    returncode: int
    output: str
    """stdout and stderr, together."""
    page: str
    """``""`` when no page carried :data:`FIRST_FAILURE` before the job ended."""


def run_watching_first_failure(run_args: list[str], env: dict[str, str], cwd: Path, port: int,
                               poll_s: float, timeout_s: float = 240) -> WatchedJob:
    """Run ``traceml run *run_args``, scraping ``port`` every ``poll_s`` until a page names the first
    failure, or the launcher has exited and nothing answers on the port any more; the job is killed if
    it outlives ``timeout_s``.

    The ranks' emitters are processes of their own: one lingering for the last scrape outlives the
    launcher, and it reads the first failure from the manifest at most once a second. So the page is
    watched past the launcher's exit, while the emitter still answers (on a loaded machine the
    launcher once exited before the emitter had read the manifest, and a watch that stopped at the
    launcher's exit saw no page with it). The output goes to a file: a pipe would tie its end to the
    emitter's, which holds the same stdout."""
    log_path = cwd / f"watched-{port}.log"
    seen = ""
    with log_path.open("w") as log:
        job = subprocess.Popen([sys.executable, "-m", "traceml_otel.cli", "run", *run_args],
                               env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                page = scrape(port)
                if FIRST_FAILURE in page:
                    seen = page
                    break
                if not page and job.poll() is not None:
                    break  # the launcher is gone and nothing lingers
                time.sleep(poll_s)
            job.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=60)
    return WatchedJob(job.returncode, log_path.read_text(errors="replace"), seen)
