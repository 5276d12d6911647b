"""Tempo and Jaeger sources against real local HTTP servers that answer in the documented shapes.

The servers hold spans built by our own span builder and answer searches the way the backends
do: Tempo's ``/api/search`` returns the first ``limit`` traces found (unordered, hex trace ids
without leading zeros, ``spss`` spans per span set with a ``matched`` count, only the selected
attributes); Jaeger's ``/api/v3/traces`` returns OTLP JSON in ``{"result": ...}`` chunks, or 404.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from tests.ports import free_port
from tests.synthetic_runs import SyntheticStep, step_spans, traces_data
from traceml_otel.analyze.diagnose import analyze_run
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.run_model import BACKWARD, FORWARD
from traceml_otel.analyze.sources.base import ReadLog, SourceError
from traceml_otel.analyze.sources.jaeger import JaegerSpanSource
from traceml_otel.analyze.sources.tempo import TempoSpanSource
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.cli.analyze import add_analyze_arguments, run_analyze

RUN = "run-7"
BASE_S = 1_800_000_000
STEP_GAP_S = 0.5


class Trace:
    """One step's spans on every rank (all ranks share the step's trace id)."""

    def __init__(self, trace_id: str, start_s: float) -> None:
        self.trace_id, self.start_s = trace_id, start_s
        self.spans: list[tuple[int, dict]] = []


def build_traces(ranks: int, steps: int, *, service: str = "train") -> dict[str, Trace]:
    traces: dict[str, Trace] = {}
    for rank in range(ranks):
        for n in range(steps):
            step = SyntheticStep(
                rank=rank,
                step=n,
                world_size=ranks,
                parallelism="ddp",
                input_wait=0.02 if rank == 1 else 0.001,
                backward=0.008 if rank == 1 else 0.027,
            )
            start_ns = int((BASE_S + n * STEP_GAP_S) * 1e9)
            for span in step_spans(RUN, step, start_ns):
                trace = traces.setdefault(span["traceId"], Trace(span["traceId"], BASE_S + n * STEP_GAP_S))
                trace.spans.append((rank, span))
    return traces


class JsonHandler(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, list[str]]]]

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def send_json(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def tempo_handler(traces: dict[str, Trace]) -> type[JsonHandler]:
    class Tempo(JsonHandler):
        requests: ClassVar[list[dict[str, list[str]]]] = []

        def do_GET(self) -> None:
            url = urlparse(self.path)
            params = parse_qs(url.query)
            Tempo.requests.append(params)
            if url.path != "/api/search":
                self.send_json(404, "{}")
                return
            query = params["q"][0]
            run = re.search(r'span\.traceml\.run\.id = "([^"]*)"', query)
            ranks = re.search(r"span\.traceml\.rank >= (\d+) && span\.traceml\.rank < (\d+)", query)
            selected = {
                name.strip().removeprefix("span.")
                for name in query.split("select(")[1].rstrip(")").split(",")
            }
            start, end = int(params["start"][0]), int(params["end"][0])
            limit, spss = int(params["limit"][0]), int(params["spss"][0])
            found = []
            for trace in traces.values():
                if run is None or run.group(1) != RUN or not start <= trace.start_s <= end:
                    continue
                spans = [
                    span
                    for rank, span in trace.spans
                    if ranks is None or int(ranks.group(1)) <= rank < int(ranks.group(2))
                ]
                if spans:
                    found.append(self.search_trace(trace, spans, selected, spss))
            random.Random(len(Tempo.requests)).shuffle(found)  # "first N found", unordered
            self.send_json(
                200, json.dumps({"traces": found[:limit], "metrics": {"inspectedTraces": len(found)}})
            )

        @staticmethod
        def search_trace(trace: Trace, spans: list[dict], selected: set[str], spss: int) -> dict:
            shown = [
                {
                    "spanID": span["spanId"],
                    "startTimeUnixNano": span["startTimeUnixNano"],
                    "durationNanos": str(int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])),
                    "attributes": [a for a in span["attributes"] if a["key"] in selected],
                }
                for span in spans[:spss]
            ]
            return {
                "traceID": trace.trace_id.lstrip("0"),
                "rootServiceName": "train",
                "startTimeUnixNano": str(int(trace.start_s * 1e9)),
                "spanSets": [{"spans": shown, "matched": len(spans)}],
            }

    return Tempo


def tempo_source(url: str, **options: object) -> TempoSpanSource:
    when = TimeRange(BASE_S - 10, BASE_S + 100)
    return TempoSpanSource(url, run_id=RUN, when=when, log=ReadLog(printed=0), **options)  # type: ignore[arg-type]


def test_tempo_pages_through_a_large_run(serve: Callable[[type[BaseHTTPRequestHandler]], str]) -> None:
    traces = build_traces(ranks=2, steps=60)
    handler = tempo_handler(traces)
    source = tempo_source(serve(handler), page_size=7)
    loaded = source.load()
    assert len(handler.requests) > 10  # full pages were split
    assert len(loaded.steps) == 120 and loaded.spans_read == 120 * 4
    step = next(s for s in loaded.steps if s.rank == 0 and s.step == 5)
    assert step.phase_calls[FORWARD] == 1  # spans on overlapping pages are counted once
    assert step.phase_cpu[BACKWARD] == pytest.approx(0.027)
    assert len(step.trace_id) == 32 and step.trace_id in traces  # the trimmed id is padded back
    analysis = analyze_run(loaded)
    assert analysis.step.primary.kind is StepKind.INPUT_STRAGGLER


def test_tempo_splits_ranks_when_span_sets_are_cut(
    serve: Callable[[type[BaseHTTPRequestHandler]], str],
) -> None:
    handler = tempo_handler(build_traces(ranks=4, steps=6))
    source = tempo_source(serve(handler), spans_per_set=10)  # 16 spans per step across 4 ranks
    loaded = source.load()
    assert len(loaded.steps) == 24 and loaded.spans_read == 96
    assert any("span.traceml.rank >=" in params["q"][0] for params in handler.requests)


def test_tempo_query_shape() -> None:
    source = TempoSpanSource("http://x", run_id='a"b', service="svc", when=TimeRange(0, 1))
    query = source.query((0, 2))
    assert query.startswith('{ span.traceml.run.id = "a\\"b" && resource.service.name = "svc"')
    assert "| select(" in query and "span.traceml.phase.cpu_duration" in query
    with pytest.raises(SourceError, match="--run-id"):
        TempoSpanSource("http://x", run_id=None, when=TimeRange(0, 1)).load()


def jaeger_handler(traces: dict[str, Trace], *, base64_ids: bool) -> type[JsonHandler]:
    def encode(span: dict) -> dict:
        span = dict(span)
        if base64_ids:
            for key in ("traceId", "spanId", "parentSpanId"):
                if span.get(key):
                    span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        return span

    class Jaeger(JsonHandler):
        requests: ClassVar[list[dict[str, list[str]]]] = []

        def do_GET(self) -> None:
            url = urlparse(self.path)
            params = parse_qs(url.query)
            Jaeger.requests.append(params)
            low = datetime.fromisoformat(params["query.start_time_min"][0].replace("Z", "+00:00")).timestamp()
            high = datetime.fromisoformat(
                params["query.start_time_max"][0].replace("Z", "+00:00")
            ).timestamp()
            depth = int(params["query.search_depth"][0])
            if url.path != "/api/v3/traces" or params["query.service_name"] != ["train"]:
                self.send_json(400, json.dumps({"error": {"message": "bad request"}}))
                return
            found = [t for t in traces.values() if low <= t.start_s <= high][:depth]
            if not found:
                self.send_json(404, json.dumps({"error": {"httpCode": 404, "message": "No traces found"}}))
                return
            chunks = []
            for trace in found:  # one {"result": ...} chunk per trace, streamed back to back
                by_rank: dict[int, list[dict]] = {}
                for rank, span in trace.spans:
                    by_rank.setdefault(rank, []).append(encode(span))
                resource = [traces_data(RUN, r, s, "train")["resourceSpans"][0] for r, s in by_rank.items()]
                chunks.append(json.dumps({"result": {"resourceSpans": resource}}))
            self.send_json(200, "\n".join(chunks))

    return Jaeger


@pytest.mark.parametrize("base64_ids", [False, True])
def test_jaeger_reads_a_run_in_pages(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], base64_ids: bool
) -> None:
    traces = build_traces(ranks=2, steps=30)
    handler = jaeger_handler(traces, base64_ids=base64_ids)
    when = TimeRange(BASE_S - 5, BASE_S + 60)
    source = JaegerSpanSource(serve(handler), service="train", when=when, page_size=8, log=ReadLog(printed=0))
    loaded = source.load()
    assert len(handler.requests) > 4
    assert len(loaded.steps) == 60 and loaded.run_id == RUN
    assert {s.trace_id for s in loaded.steps} == set(traces)
    assert all(s.phase_calls[FORWARD] == 1 for s in loaded.steps)
    assert analyze_run(loaded).step.primary.kind is StepKind.INPUT_STRAGGLER


def test_jaeger_empty_search_is_no_data(serve: Callable[[type[BaseHTTPRequestHandler]], str]) -> None:
    url = serve(jaeger_handler({}, base64_ids=False))
    loaded = JaegerSpanSource(url, service="train", when=TimeRange(BASE_S, BASE_S + 5)).load()
    assert loaded.steps == ()
    assert analyze_run(loaded).step.primary.kind is StepKind.NO_DATA
    with pytest.raises(SourceError, match="--service"):
        JaegerSpanSource(url, service=None, when=TimeRange(0, 1)).load()


def closed_port() -> int:
    return free_port()


def analyze_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_analyze_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("flag", ["--tempo", "--jaeger"])
def test_unreachable_backend_is_a_clear_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code = run_analyze(analyze_args(flag, url, "--run-id", RUN, "--service", "train", "--timeout", "5"))
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot reach {'Tempo' if flag == '--tempo' else 'Jaeger'} at {url}" in err


def test_backend_error_status_is_reported(
    serve: Callable[[type[BaseHTTPRequestHandler]], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(jaeger_handler({}, base64_ids=False))
    assert run_analyze(analyze_args("--jaeger", url, "--service", "nobody")) == 2
    assert "HTTP 400" in capsys.readouterr().err
