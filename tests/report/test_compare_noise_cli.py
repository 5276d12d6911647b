"""``traceml compare`` with intervals: several runs per side, bad numbers, strict JSON and HTML.

Synthetic run folders (``tests.synthetic_runs``) with noisy, autocorrelated step times; the CLI is
run in a real subprocess.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.synthetic_runs import SyntheticStep, write_run
from traceml_otel.analyze import analyze_path
from traceml_otel.report import render
from traceml_otel.report.run_summary import ReportFormatError, summary_from_report


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONUNBUFFERED="1")
    return env


def cli(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", *arguments], env=_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def noisy_run(folder: Path, run_id: str, seed: int, forward: float = 0.004, steps: int = 120) -> Path:
    """A run whose forward time wanders (AR(1), 10 % spread) around ``forward``."""
    rng = np.random.default_rng(seed)
    level = 0.0
    rows = []
    for n in range(steps):
        level = 0.7 * level + rng.normal(0, 0.07)
        rows.append(SyntheticStep(rank=0, step=n, forward=forward * math.exp(level), samples=8))
    return write_run(folder / run_id, run_id, rows)


def strict(text: str) -> dict[str, object]:
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_several_runs_per_side_pool_their_spread(tmp_path: Path) -> None:
    for i in range(3):
        noisy_run(tmp_path / "base", f"a{i}", seed=i)
        noisy_run(tmp_path / "slow", f"b{i}", seed=10 + i, forward=0.008)
        noisy_run(tmp_path / "same", f"c{i}", seed=20 + i)
    same = cli(tmp_path, "compare", str(tmp_path / "base" / "a0"), str(tmp_path / "base" / "a1"),
               str(tmp_path / "base" / "a2"), "--against", str(tmp_path / "same"), "--json",
               "--fail-on-regression")
    assert same.returncode == 0, same.stdout + same.stderr
    document = strict(same.stdout)
    interval = document["interval"]
    assert isinstance(interval, dict) and interval["between_runs"] is True
    assert "pooled t over 3+3 runs" in str(interval["method"])
    assert document["verdict"] in ("EQUIVALENT", "INCONCLUSIVE")
    assert len(document["b"]["runs"]) == 3  # type: ignore[index]
    slow = cli(tmp_path, "compare", str(tmp_path / "base" / "a*"), "--against", str(tmp_path / "slow" / "b*"),
               "--fail-on-regression")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert "REGRESSION" in slow.stdout and "interval from 3 + 3 runs" in slow.stdout
    assert "(±" in slow.stdout and "method" in slow.stdout


def test_the_two_argument_form_says_only_within_run_noise_was_available(tmp_path: Path) -> None:
    a, b = noisy_run(tmp_path, "a", 1), noisy_run(tmp_path, "b", 2)
    done = cli(tmp_path, "compare", str(a), str(b))
    assert done.returncode == 0, done.stderr
    assert "only within-run noise was available" in done.stdout
    assert "95 % interval" in done.stdout and "batch means" in done.stdout


def test_a_report_with_nan_is_bad_data_and_fails_the_gate(tmp_path: Path) -> None:
    run = noisy_run(tmp_path, "a", 1)
    good = tmp_path / "good.json"
    good.write_text(render(analyze_path([run]), "json"))
    report = json.loads(good.read_text())
    report["throughput"]["time_per_sample_s"] = float("nan")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))  # Python writes the NaN token
    assert "NaN" in bad.read_text()
    for first, second in ((good, bad), (bad, good), (good, good)):
        gated = cli(tmp_path, "compare", str(first), str(second), "--fail-on-regression", "--json")
        document = strict(gated.stdout)
        if first == second:
            assert gated.returncode == 0
            continue
        assert gated.returncode == 3, gated.stdout + gated.stderr
        assert document["verdict"] == "INCONCLUSIVE" and document["usable"] is False
        assert "bad data: throughput.time_per_sample_s is not a finite number" in gated.stdout
        assert len(gated.stderr.strip().splitlines()) == 1
    infinite = json.loads(good.read_text())
    infinite["noise"]["block_means_s"][0] = float("inf")
    bad.write_text(json.dumps(infinite))
    gated = cli(tmp_path, "compare", str(good), str(bad), "--fail-on-regression")
    assert gated.returncode == 3 and "EQUIVALENT" not in gated.stdout and "bad data" in gated.stdout


def test_a_schema_version_that_is_not_an_integer_is_malformed_and_printed_bounded(tmp_path: Path) -> None:
    run = noisy_run(tmp_path, "a", 1)
    report = json.loads(render(analyze_path([run]), "json"))
    for version in ("2", 2.0, True, "x" * 10_000):
        report["schema_version"] = version
        with pytest.raises(ReportFormatError, match="malformed report: schema_version") as caught:
            summary_from_report(report, "r.json")
        assert len(str(caught.value)) < 200
    report["schema_version"] = "9" * 5000
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    done = cli(tmp_path, "compare", str(path), str(run))
    assert done.returncode == 2 and "malformed report" in done.stderr and len(done.stderr) < 400


def test_html_comparison_escapes_every_string(tmp_path: Path) -> None:
    a = noisy_run(tmp_path, "<script>alert(1)</script>", 1)
    b = noisy_run(tmp_path, "b", 2, forward=0.006)
    out = tmp_path / "cmp.html"
    for flags in (("--html", "-o", str(out)), ("--format", "html", "-o", str(out))):
        done = cli(tmp_path, "compare", str(a), str(b), *flags)
        assert done.returncode == 0, done.stderr
        page = out.read_text()
        assert page.startswith("<!DOCTYPE html>") and "<script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "95 % interval" in page and "batch means" in page and "REGRESSION" in page
    piped = cli(tmp_path, "compare", str(a), str(b), "--html")
    assert piped.returncode == 0 and piped.stdout.startswith("<!DOCTYPE html>")


def test_a_folder_of_runs_is_one_side(tmp_path: Path) -> None:
    for i in range(2):
        noisy_run(tmp_path / "base", f"a{i}", seed=i)
        noisy_run(tmp_path / "cand", f"b{i}", seed=5 + i)
    done = cli(tmp_path, "compare", str(tmp_path / "base"), "--against", str(tmp_path / "cand"), "--json")
    assert done.returncode == 0, done.stderr
    document = strict(done.stdout)
    assert len(document["a"]["runs"]) == 2 and document["interval"]["between_runs"] is True  # type: ignore[index]
    wrong = cli(tmp_path, "compare", str(tmp_path / "base"))
    assert wrong.returncode == 2 and "--against" in wrong.stderr
