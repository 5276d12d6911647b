"""OTLP JSON normalisation and the file source: envelopes, ids, enums, bad lines named by file:line."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from tests.synthetic_runs import SyntheticStep, otlp_lines, step_spans, traces_data, write_run
from traceml_otel.analyze.kinds import StepKind
from traceml_otel.analyze.otlp_decode import (
    ForeignDocument,
    as_float,
    as_int,
    is_error_status,
    resource_spans,
    span_id_hex,
    trace_id_hex,
)
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.analyze.sources.base import ReadLog, SourceError
from traceml_otel.analyze.sources.files import FileSpanSource
from traceml_otel.contract import traces_file_name

HEX_TRACE = "0af7651916cd43dd8448eb211c80319c"


def b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (HEX_TRACE, HEX_TRACE),
        (HEX_TRACE.upper(), HEX_TRACE),
        ("f7651916cd43dd8448eb211c80319c", "00" + HEX_TRACE[2:]),  # Tempo trims leading zeros
        (b64(HEX_TRACE), HEX_TRACE),
        (b64(HEX_TRACE).rstrip("="), HEX_TRACE),
        (base64.urlsafe_b64encode(bytes.fromhex("fb" * 16)).decode(), "fb" * 16),
        ("not an id!", ""),
        (None, ""),
    ],
)
def test_trace_ids_in_hex_or_base64(raw: object, expected: str) -> None:
    assert trace_id_hex(raw) == expected


def test_span_ids() -> None:
    assert span_id_hex("00f067aa0ba902b7") == "00f067aa0ba902b7"
    assert span_id_hex(b64("00f067aa0ba902b7")) == "00f067aa0ba902b7"
    assert span_id_hex(b64(HEX_TRACE)) == ""  # 16 bytes is not a span id


def test_numbers_as_strings_or_numbers() -> None:
    assert as_int("42") == 42 and as_int(42) == 42 and as_int("42.0") == 42 and as_int(True) is None
    assert as_float("0.5") == 0.5 and as_float(1) == 1.0 and as_float("NaN") is None and as_float("x") is None


def test_status_enum_as_integer_or_name() -> None:
    assert is_error_status({"status": {"code": 2}})
    assert is_error_status({"status": {"code": "STATUS_CODE_ERROR"}})
    assert not is_error_status({"status": {"code": "STATUS_CODE_OK"}})
    assert not is_error_status({"status": {}})


def test_envelopes() -> None:
    inner = {"resourceSpans": [{"scopeSpans": []}]}
    assert resource_spans(inner) == inner["resourceSpans"]
    assert resource_spans({"batches": inner["resourceSpans"]}) == inner["resourceSpans"]
    assert resource_spans({"trace": inner}) == inner["resourceSpans"]
    assert resource_spans({"result": inner}) == inner["resourceSpans"]
    assert resource_spans({"resource_spans": inner["resourceSpans"]}) == inner["resourceSpans"]
    assert resource_spans([inner, inner]) == inner["resourceSpans"] * 2
    with pytest.raises(ForeignDocument):
        resource_spans({"resourceMetrics": []})


def protobuf_style(run_id: str, steps: list[SyntheticStep]) -> dict:
    """Tempo ``/api/traces/<id>`` style: ``batches``, base64 ids, enum names, snake_case, ints as numbers."""
    spans = [span for step in steps for span in step_spans(run_id, step, 10**18 + step.step * 10**8)]
    for span in spans:
        span["trace_id"] = b64(span.pop("traceId"))
        span["spanId"] = b64(span["spanId"])
        span["kind"] = "SPAN_KIND_INTERNAL"
        span["start_time_unix_nano"] = int(span.pop("startTimeUnixNano"))
        for attribute in span["attributes"]:
            value = attribute["value"]
            if "intValue" in value:
                value["intValue"] = int(value["intValue"])
    document = traces_data(run_id, 0, spans, "svc")
    return {"batches": document["resourceSpans"]}


def test_a_pretty_printed_tempo_trace_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"trace": protobuf_style("r1", [SyntheticStep(rank=0, step=7)])}, indent=2))
    loaded = FileSpanSource([path]).load()
    (step,) = loaded.steps
    assert (step.run_id, step.rank, step.step, len(step.trace_id)) == ("r1", 0, 7, 32)
    assert step.traced_cpu == pytest.approx(SyntheticStep(rank=0, step=7).traced_time())
    assert loaded.warnings_total == 0


def run_with_bad_lines(tmp_path: Path) -> Path:
    run = write_run(
        tmp_path / "run", "r1", [SyntheticStep(rank=0, step=n) for n in range(30)], steps_per_line=5
    )
    path = run / traces_file_name(0)
    lines = path.read_text().splitlines()
    lines.insert(2, lines[2][: len(lines[2]) // 2])  # truncated copy
    lines.insert(4, "\x00\x01 garbage")
    lines.insert(5, json.dumps({"resourceMetrics": []}))
    lines.append(lines[-1][:40])  # the run was killed mid-write
    path.write_text("\n".join(lines) + "\n")
    return run


def test_bad_lines_are_named_and_the_rest_is_analysed(tmp_path: Path) -> None:
    run = run_with_bad_lines(tmp_path)
    stream = io.StringIO()
    analysis = analyze_path([run], log=ReadLog(stream))
    printed = stream.getvalue()
    name = run / traces_file_name(0)
    for line in (3, 5, 6, 10):
        assert f"{name}:{line}:" in printed
    assert "no OTLP traces" in printed and "corrupt or truncated" in printed
    assert analysis.run.warnings_total == 4
    assert analysis.window.steps == 30
    assert analysis.step.primary.kind == StepKind.BALANCED


def test_malformed_spans_are_a_warning_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    good = next(otlp_lines("r1", [SyntheticStep(rank=0, step=0)]))[1]
    odd = {
        "resourceSpans": [
            {"scopeSpans": [{"spans": [{"name": "traceml.step", "attributes": [{"value": 1}]}]}]}
        ]
    }
    path.write_text(json.dumps(odd) + "\n" + good + "\n")
    log = ReadLog(io.StringIO())
    loaded = FileSpanSource([path], log=log).load()
    assert len(loaded.steps) == 1 and log.total == 1 and f"{path}:1:" in log.warnings[0]


def test_foreign_spans_are_ignored_and_other_services_filtered(tmp_path: Path) -> None:
    path = tmp_path / "collector.jsonl"
    ours = traces_data("r1", 0, step_spans("r1", SyntheticStep(rank=0, step=0), 10**18), "train")
    theirs = traces_data("r1", 0, step_spans("r1", SyntheticStep(rank=0, step=1), 10**18), "other")
    foreign = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "GET /", "attributes": []}]}]}]}
    path.write_text("\n".join(json.dumps(d) for d in (ours, theirs, foreign)) + "\n")
    assert [s.step for s in FileSpanSource([path], service="train").load().steps] == [0]
    loaded = FileSpanSource([path]).load()
    assert [s.step for s in loaded.steps] == [0, 1] and loaded.foreign_spans == 1


def test_several_runs_in_one_dump(tmp_path: Path) -> None:
    path = tmp_path / "dump.jsonl"
    lines = [line for _, line in otlp_lines("big", [SyntheticStep(rank=0, step=n) for n in range(5)])]
    lines += [line for _, line in otlp_lines("small", [SyntheticStep(rank=0, step=n) for n in range(2)])]
    path.write_text("\n".join(lines) + "\n")
    log = ReadLog(io.StringIO())
    loaded = FileSpanSource([path], log=log).load()
    assert loaded.run_id == "big" and loaded.other_run_ids == ("small",) and "--run-id" in log.warnings[0]
    assert len(FileSpanSource([path], run_id="small").load().steps) == 2


def test_orphan_phase_spans_are_counted_not_analysed(tmp_path: Path) -> None:
    spans = step_spans("r1", SyntheticStep(rank=0, step=0), 10**18)[1:]  # no traceml.step span
    path = tmp_path / "orphans.jsonl"
    path.write_text(json.dumps(traces_data("r1", 0, spans, "svc")) + "\n")
    loaded = FileSpanSource([path]).load()
    assert loaded.steps == () and loaded.orphan_steps == 1


def test_missing_input_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        FileSpanSource([tmp_path / "nope"]).load()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no rank-"):
        FileSpanSource([tmp_path / "empty"]).load()


def test_parallel_read_equals_serial_read(tmp_path: Path) -> None:
    steps = [SyntheticStep(rank=r, step=n, input_wait=0.001 * (r + 1)) for r in range(3) for n in range(40)]
    run = write_run(tmp_path / "run", "r1", steps)
    (run / traces_file_name(1)).write_text((run / traces_file_name(1)).read_text() + "{broken\n")
    serial_log, parallel_log = ReadLog(io.StringIO()), ReadLog(io.StringIO())
    serial = FileSpanSource([run], workers=1, log=serial_log).load()
    parallel = FileSpanSource([run], workers=2, log=parallel_log).load()
    assert parallel.steps == serial.steps and len(serial.steps) == 120
    assert parallel_log.warnings == serial_log.warnings and len(serial_log.warnings) == 1


def test_the_manifest_run_is_preferred_when_present(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "small", [SyntheticStep(rank=0, step=n) for n in range(3)])
    other = [line for _, line in otlp_lines("big", [SyntheticStep(rank=0, step=n) for n in range(9)])]
    (run / "rank-1.traces.jsonl").write_text("\n".join(other) + "\n")
    assert analyze_path([run], log=ReadLog(io.StringIO())).run.run_id == "small"  # manifest.json says "small"
    (run / "manifest.json").write_text(json.dumps({"run_id": "renamed"}))
    assert analyze_path([run], log=ReadLog(io.StringIO())).run.run_id == "big"
