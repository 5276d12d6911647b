"""Hostile backends (issues 21, 18): every protocol or shape error of a Tempo, Jaeger or Prometheus
answer is one line with the bad-input exit code, nothing a server sends reaches the terminal with its
control characters, and an answer that would decode into too many objects is refused before it is decoded."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from tests.analyze.test_analyze_backends import RUN, analyze_args
from tests.analyze.test_bounded_reads import Endless, Quiet, Trickle
from traceml_otel.cli.analyze import run_analyze

ESC = "\x1b"


class _Reply:
    """What the module's two servers answer now (set by each test)."""

    raw = b""
    status, body, content_type = 200, b"{}", "application/json"


def _serve_raw(listener: socket.socket) -> None:
    """Answer every connection with ``_Reply.raw`` (any bytes, HTTP or not) and close it."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(_Reply.raw)
            except OSError:
                pass


@pytest.fixture(scope="module")
def raw_url() -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=_serve_raw, args=(listener,), daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


class _Answer(Quiet):
    def do_GET(self) -> None:
        self.send_response(_Reply.status)
        self.send_header("Content-Type", _Reply.content_type)
        self.send_header("Content-Length", str(len(_Reply.body)))
        self.end_headers()
        self.wfile.write(_Reply.body)


@pytest.fixture(scope="module")
def answer_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _answering(url: str, status: int, body: bytes, content_type: str = "application/json") -> str:
    _Reply.status, _Reply.body, _Reply.content_type = status, body, content_type
    return url


def _args(flag: str, url: str):
    return analyze_args(flag, url, "--run-id", RUN, "--service", "train", "--timeout", "5")


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and ESC not in err, repr(err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flag", ["--tempo", "--jaeger", "--prometheus"])
@pytest.mark.parametrize("reply", [
    b"\x1b[2J\x1b[31mHELLO hostile\r\n\r\n",  # not HTTP at all
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n\x1b[2Jx",  # HTTP, body not JSON
    b"HTTP/1.1 99999 \x1b[2J\r\n\r\n",  # a status line that is not one
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",  # cut short
])
def test_a_protocol_error_is_one_line_without_the_servers_escapes(raw_url, capsys, flag, reply) -> None:
    _Reply.raw = reply
    url = raw_url
    line = _one_line_error(capsys, run_analyze(_args(flag, url)))
    assert line.startswith("traceml analyze: error:"), line


@pytest.mark.parametrize("flag", ["--tempo", "--jaeger"])
@pytest.mark.parametrize("body", [
    b'{"traces": null}', b'{"traces": [null, 1, "x"]}', b'{"traces": {"a": 1}}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": null}]}]}',
    b'{"result": {"resourceSpans": [{"scopeSpans": null}]}}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [null, 1, {"name": null}]}]}]}',
    b'{"data": null}', b"[]", b"null", b'"\x1b[2J"',
])
def test_a_shape_error_is_never_a_traceback(answer_url, capsys, flag, body) -> None:
    url = _answering(answer_url, 200, body)
    code = run_analyze(_args(flag, url))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and ESC not in captured.err + captured.out
    assert code in (1, 2), captured.err  # no data, or bad input


@pytest.mark.parametrize("flag", ["--tempo", "--jaeger", "--prometheus"])
def test_an_error_body_is_printed_without_control_characters(answer_url, capsys, flag) -> None:
    url = _answering(answer_url, 500, b"\x1b[2J\x1b]0;owned\x07 internal error \x1b[31mred", "text/plain")
    line = _one_line_error(capsys, run_analyze(_args(flag, url)))
    assert "HTTP 500" in line and "internal error" in line and "\x07" not in line


def test_an_answer_of_millions_of_empty_objects_is_refused_before_decoding(answer_url, capsys) -> None:
    body = b'{"traces": [' + b"{}," * 5_000_000 + b"{}]}"  # 15 MiB of JSON, ~400 MiB once decoded
    url = _answering(answer_url, 200, body)
    code = run_analyze(analyze_args("--tempo", url, "--run-id", RUN, "--since", "1799999990",
                                    "--until", "1799999991"))
    line = _one_line_error(capsys, code)
    assert "JSON items" in line, line


def _vector(*items: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(items)}}).encode()


class _PrometheusAnswer(Quiet):
    """A run found by the first (range) query; every instant query answers ``_Reply.body``."""

    def do_GET(self) -> None:
        body = _Reply.body
        if self.path.startswith("/api/v1/query_range"):
            now = time.time()
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {}, "values": [[now - 60, "5"], [now - 30, "9"]]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def prometheus_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PrometheusAnswer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


NOT_API = "not a Prometheus API answer"
NO_VECTOR = "query with no vector result"


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"status": "success", "data": null}', NO_VECTOR), (b'{"status": "success"}', NO_VECTOR),
    (b"[]", NOT_API), (b"null", NOT_API), (b'"\\u001b[2J"', NOT_API),
    (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', NO_VECTOR),
    (b'{"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}', NO_VECTOR),
    (b'{"status": "\\u001b[2J", "error": {"deep": [[["\\u001b]0;owned\\u0007"]]]}}', "refused the query"),
    (_vector(None, 1, "x", {"metric": None}, {"metric": {"traceml_rank": "0"}, "value": None}), None),
    (_vector({"metric": {"traceml_rank": "0"}, "value": [1, {"a": 1}]},
             {"metric": {"traceml_rank": ["0"]}, "value": [1, "5"]},
             {"metric": {"traceml_rank": "-1"}, "value": [1, "5"]},
             {"metric": {"traceml_rank": "99999999999"}, "value": [1, "5"]}), None),
    (_vector({"metric": {"traceml_rank": "0"}, "value": [1, "1e308"]},
             {"metric": {"traceml_rank": "1"}, "value": [1, "NaN"]},
             {"metric": {"traceml_rank": "2"}, "value": [1, "+Inf"]},
             {"metric": {"traceml_rank": "3", "traceml_phase_name": "\x1b[2J"}, "value": ["x", "1" * 5000]}),
     "implausible step count"),
    (_vector(*({"metric": {"traceml_rank": str(r)}, "value": [1, "1"]} for r in range(100_001))),
     "series for one query"),
])
def test_a_prometheus_shape_error_is_never_a_traceback(prometheus_url, capsys, body, expected) -> None:
    """Wrong types, non-finite and huge numbers, hostile labels, too many series: one clear line
    (exit 2), or no data (exit 1) when nothing usable is left; never a traceback or an escape."""
    url = _answering(prometheus_url, 200, body)
    code = run_analyze(_args("--prometheus", url))
    if expected is None:
        captured = capsys.readouterr()
        assert code == 1 and "Traceback" not in captured.err, captured.err
        assert ESC not in captured.err + captured.out and "NO DATA" in captured.out
    else:
        line = _one_line_error(capsys, code)
        assert expected in line, line


def test_a_refused_promql_query_names_the_engines_reason(answer_url, capsys) -> None:
    body = (b'{"status": "error", "errorType": "execution", '
            b'"error": "query processing would load too many samples\\u001b[2J"}')
    url = _answering(answer_url, 422, body)
    line = _one_line_error(capsys, run_analyze(_args("--prometheus", url)))
    assert "HTTP 422" in line and "too many samples" in line
    url = _answering(answer_url, 200, body)
    line = _one_line_error(capsys, run_analyze(_args("--prometheus", url)))
    assert "refused the query: query processing would load too many samples" in line


def test_an_endless_prometheus_answer_stops_at_the_size_limit(serve, capsys) -> None:
    url = serve(Endless)
    started = time.monotonic()
    code = run_analyze(analyze_args("--prometheus", url, "--run-id", RUN, "--max-response-mb", "8"))
    assert code == 2 and time.monotonic() - started < 30
    assert "answered more than 8 MiB (--max-response-mb)" in capsys.readouterr().err


def test_a_trickling_prometheus_stops_at_the_total_deadline(serve, capsys) -> None:
    url = serve(Trickle)
    started = time.monotonic()
    code = run_analyze(analyze_args("--prometheus", url, "--run-id", RUN, "--timeout", "5",
                                    "--read-deadline", "2"))
    assert code == 2 and time.monotonic() - started < 20
    assert "total deadline of 2 s (--read-deadline)" in capsys.readouterr().err


def test_a_silent_prometheus_is_a_timeout(serve, capsys) -> None:
    class Silent(Quiet):
        def do_GET(self) -> None:
            time.sleep(3)

    url = serve(Silent)
    started = time.monotonic()
    line = _one_line_error(capsys, run_analyze(analyze_args("--prometheus", url, "--run-id", RUN,
                                                            "--timeout", "1")))
    assert time.monotonic() - started < 10
    assert "did not answer within 1 s (--timeout)" in line, line


def test_an_engines_warnings_reach_the_report(prometheus_url, capsys) -> None:
    """A partial answer (Thanos: a store was down) is said, stripped of control characters."""
    answer = json.loads(_vector({"metric": {"traceml_rank": "0"}, "value": [1, "30"]}))
    answer["warnings"] = ["partial response: store \x1b[31mB unreachable"]
    url = _answering(prometheus_url, 200, json.dumps(answer).encode())
    run_analyze(_args("--prometheus", url))
    captured = capsys.readouterr()
    assert "partial response: store" in captured.err + captured.out and ESC not in captured.err + captured.out
