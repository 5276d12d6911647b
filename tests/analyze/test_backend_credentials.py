"""A password in a backend URL authenticates and is never printed (issue 38).

``--jaeger``/``--tempo``/``--prometheus http://alice:S3CRET@host`` send HTTP basic authentication, as
curl and the OTel exporters do with URL user-info; every line printed and every report (text, JSON,
HTML) names the URL with the password replaced. A real ``traceml analyze`` process against a local
127.0.0.1 server that requires the credentials (the Jaeger replay of ``test_analyze_backends``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.analyze.test_analyze_backends import BASE_S, RUN, build_traces, closed_port, jaeger_handler

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "S3CRET-pw"
EXPECTED = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


def _guarded(handler: type[BaseHTTPRequestHandler], seen: list[str]) -> type[BaseHTTPRequestHandler]:
    class Guarded(handler):  # type: ignore[misc,valid-type]
        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "")
            seen.append(given)
            if given != EXPECTED:
                self.send_json(401, json.dumps({"error": "unauthorized"}))
                return
            super().do_GET()

    return Guarded


def _analyze(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _window() -> list[str]:
    return ["--since", str(BASE_S - 5), "--until", str(BASE_S + 60)]


def test_basic_auth_from_the_url_works_and_the_password_is_never_printed(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], tmp_path: Path,
) -> None:
    seen: list[str] = []
    url = serve(_guarded(jaeger_handler(build_traces(ranks=2, steps=20), base64_ids=False), seen))
    secret_url = url.replace("http://", f"http://alice:{PASSWORD}@")
    outputs = []
    for form in ("text", "json", "html"):
        done = _analyze(tmp_path, "--jaeger", secret_url, "--service", "train", "--run-id", RUN, *_window(),
                        "--format", form, "--output", str(tmp_path / f"report.{form}"))
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr, (tmp_path / f"report.{form}").read_text()]
    assert seen and set(seen) == {EXPECTED}  # every request authenticated, none without
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run"]["steps_read"] == 40
    assert "alice:[redacted]@127.0.0.1" in report["run"]["source"]
    assert all(PASSWORD not in text for text in outputs)


def test_a_refused_password_is_one_line_without_it(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], tmp_path: Path,
) -> None:
    url = serve(_guarded(jaeger_handler(build_traces(ranks=1, steps=2), base64_ids=False), []))
    wrong = url.replace("http://", "http://alice:WR0NG-pw@")
    done = _analyze(tmp_path, "--jaeger", wrong, "--service", "train", "--run-id", RUN, *_window())
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "HTTP 401" in line and "credentials in the URL were refused" in line and "WR0NG" not in line


@pytest.mark.parametrize("flag", ["--prometheus", "--tempo", "--jaeger"])
def test_an_unreachable_backend_error_hides_the_password(flag: str, tmp_path: Path) -> None:
    url = f"http://alice:{PASSWORD}@127.0.0.1:{closed_port()}"
    done = _analyze(tmp_path, flag, url, "--run-id", RUN, "--service", "train", "--timeout", "5", *_window())
    assert done.returncode == 2
    assert PASSWORD not in done.stdout + done.stderr
    assert "alice:[redacted]@127.0.0.1" in done.stderr, done.stderr
