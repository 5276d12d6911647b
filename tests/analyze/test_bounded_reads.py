"""Backend reads are bounded in time and size: endless, trickling and hostile answers from a
real local HTTP server end with a clear error (or a skipped span), never a hang or a crash."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

from tests.analyze.test_analyze_backends import RUN, analyze_args, build_traces, tempo_handler
from traceml_otel.cli.analyze import run_analyze


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class Endless(Quiet):
    """200 OK, no length, and JSON-looking bytes as fast as the socket takes them, forever."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        chunk = b'{"traces": [' + b'{"traceID": "ab", "spanSets": []},' * 2000
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass


class Trickle(Quiet):
    """Answers one byte every 0.2 s: each read is quick, the whole never ends."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass


class Deep(Quiet):
    """A Tempo answer nested 100,000 levels deep."""

    def do_GET(self) -> None:
        body = b"[" * 100_000 + b"]" * 100_000
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_endless_answer_stops_at_the_size_limit(serve, capsys) -> None:
    url = serve(Endless)
    started = time.monotonic()
    code = run_analyze(analyze_args("--tempo", url, "--run-id", RUN, "--max-response-mb", "8"))
    assert code == 2 and time.monotonic() - started < 30
    assert "answered more than 8 MiB (--max-response-mb)" in capsys.readouterr().err


def test_trickling_answer_stops_at_the_total_deadline(serve, capsys) -> None:
    url = serve(Trickle)
    started = time.monotonic()
    code = run_analyze(analyze_args("--tempo", url, "--run-id", RUN, "--timeout", "5",
                                    "--read-deadline", "2"))
    elapsed = time.monotonic() - started
    assert code == 2 and 1.5 < elapsed < 20
    assert "total deadline of 2 s (--read-deadline)" in capsys.readouterr().err


def test_deeply_nested_answer_is_a_clear_error(serve, capsys) -> None:
    url = serve(Deep)
    assert run_analyze(analyze_args("--tempo", url, "--run-id", RUN)) == 2
    assert "nested too deeply" in capsys.readouterr().err


def test_hostile_spans_in_a_tempo_answer_are_skipped(serve, capsys) -> None:
    """1e400 and a nested object where numbers belong: those spans are skipped, the rest analysed."""
    base = tempo_handler(build_traces(ranks=2, steps=12))

    class Hostile(base):  # type: ignore[misc, valid-type]
        def send_json(self, status: int, body: str) -> None:
            document = json.loads(body)
            if document.get("traces"):
                spans = document["traces"][0]["spanSets"][0]["spans"]
                spans[0]["startTimeUnixNano"] = 1e400
                if len(spans) > 1:
                    spans[1]["durationNanos"] = {"deep": [[[1]]]}
                spans.append("not a span")
            super().send_json(status, json.dumps(document))

    url = serve(Hostile)
    code = run_analyze(analyze_args("--tempo", url, "--run-id", RUN, "--since", "1799999990",
                                    "--until", "1800000100"))
    captured = capsys.readouterr()
    assert code == 0, captured.err  # the other spans were analysed
    assert "skipped a malformed span" in captured.err and "2 ranks" in captured.out
