"""A seeded mutation fuzz of the analyzer's file input: no mutated local-copy line may crash it.

Lines of a real local copy (written by our emitter) are mutated at the JSON level (values swapped
for ``1e400``, huge or negative numbers, wrong types, deep nesting, keys dropped, lists
duplicated) and at the byte level (cut, flipped, spliced), then put between two valid lines and
analysed end to end (read, assemble, diagnose, text and JSON report). Any exception is a failure.
Bounded: FUZZ_CASES cases or FUZZ_BUDGET_S seconds, whichever comes first (both can be raised from the
environment for a deeper run).
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.emit.test_emitter_faults import _hello
from traceml_otel.analyze.pipeline import analyze_path
from traceml_otel.emit.worker import Emitter
from traceml_otel.report import render
from traceml_otel.wire.step_row import PhaseRow, StepRow

FUZZ_SEED = 20261130
FUZZ_CASES = int(os.environ.get("FUZZ_CASES", "1500"))
FUZZ_BUDGET_S = float(os.environ.get("FUZZ_BUDGET_S", "12"))
"""1,500 cases in CI (about 10 s; the suite's 10-minute budget); ``FUZZ_CASES=20000 FUZZ_BUDGET_S=300``
for a deeper run of the same seeded stream."""
_PLACEHOLDER = "__traceml_fuzz__"
_HOSTILE_TEXT = [
    "1e400", "-1e400", "1e308", "-1.7976931348623157e308", "1" + "0" * 400, "-1", "0",
    "18446744073709551616", "NaN", "Infinity", "null", "true",
    '"x"', '""', "[]", "{}", '"\\u0000\\u001b[31m"', "[" * 3000 + "]" * 3000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    '[{"key":"traceml.step.number","value":{"intValue":"1e400"}}]', '{"intValue":"99999999999999999999999"}',
]


def _valid_lines(tmp_path: Path) -> list[str]:
    """A few lines of a real two-rank local copy."""
    lines = []
    for rank in (0, 1):
        run_dir = tmp_path / f"r{rank}"
        emitter = Emitter(_hello(run_dir, rank=rank, local_rank=rank, world_size=2))
        for first in range(0, 24, 8):
            rows = []
            for step in range(first, first + 8):
                start = 1_000_000_000 + step * 10_000_000
                phases = [PhaseRow.timed("forward", 0, start + 10, start + 4_000_000, None),
                          PhaseRow.timed("backward", 0, start + 4_000_000, start + 8_000_000, None),
                          PhaseRow.timed("optimizer", 0, start + 8_000_000, start + 9_000_000, None)]
                rows.append(StepRow.of(step=step, start_ns=start, end_ns=start + 9_500_000,
                                     input_wait_ns=200_000, input_fetches=1, optimizer_steps=1,
                                     parallelism="ddp", phases=phases))
            emitter.handle_steps(rows)
        emitter.finish("ok", 0, True, steps_traced=24)
        lines += (run_dir / f"rank-{rank}.traces.jsonl").read_text().splitlines()
    return lines


def _nodes(value: object, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _nodes(child, (*path, index))
    return found


def _get(value: object, path: tuple) -> object:
    for part in path:
        value = value[part]  # type: ignore[index]
    return value


def _mutate_json(rng: random.Random, line: str) -> str:
    document = json.loads(line)
    raw_texts: list[str] = []
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _nodes(document) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = _get(document, path[:-1])
        key = path[-1]
        action = rng.random()
        if action < 0.55:  # a hostile value, spliced in as raw JSON text
            raw_texts.append(rng.choice(_HOSTILE_TEXT))
            parent[key] = f"{_PLACEHOLDER}{len(raw_texts) - 1}"  # type: ignore[index]
        elif action < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif action < 0.8 and isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), parent[key] if rng.random() < 0.5 else None)
        elif action < 0.9:
            parent[key] = rng.choice([[], {}, "", 0, -5, 3.5, True, None, [parent[key]]])  # type: ignore[index]
        else:
            parent[key] = {"k": parent[key]} if not isinstance(parent[key], dict) else list(parent[key])  # type: ignore[index]
    text = json.dumps(document, separators=(",", ":"))
    for index, raw in enumerate(raw_texts):
        text = text.replace(f'"{_PLACEHOLDER}{index}"', raw)
    return text


def _mutate_bytes(rng: random.Random, line: str) -> str:
    data = bytearray(line.encode())
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        position = rng.randrange(len(data))
        if choice < 0.3:
            data = data[:position]
        elif choice < 0.6:
            data[position] = rng.randrange(256)
        else:
            data[position:position] = rng.choice(
                [b"\x00", b"\xff\xfe", b'"', b"{", b"]", b"\x1b[2J", b"1e400"])
        if not data:
            break
    return data.decode("utf-8", "replace").replace("\n", " ")


def test_mutated_local_copy_lines_never_crash_the_analyzer(tmp_path: Path) -> None:
    lines = _valid_lines(tmp_path)
    rng = random.Random(FUZZ_SEED)
    started = time.monotonic()
    cases = 0
    path = tmp_path / "case.jsonl"
    while cases < FUZZ_CASES and time.monotonic() - started < FUZZ_BUDGET_S:
        base = rng.choice(lines)
        mutated = _mutate_json(rng, base) if rng.random() < 0.7 else _mutate_bytes(rng, base)
        before, after = rng.choice(lines), rng.choice(lines)
        path.write_text("\n".join([before, mutated, after]) + "\n", encoding="utf-8")
        try:
            analysis = analyze_path([path])
            render(analysis, "text")
            render(analysis, "json")
        except Exception as error:  # pragma: no cover - a failure shows the case
            raise AssertionError(f"case {cases} (seed {FUZZ_SEED}) crashed the analyzer: "
                                 f"{type(error).__name__}: {error}\nline: {mutated[:500]}") from error
        cases += 1
    elapsed = time.monotonic() - started
    print(f"fuzz: {cases} cases in {elapsed:.1f} s, no crash")
    assert cases >= 300, f"only {cases} cases ran in {elapsed:.1f} s"


def test_1e400_and_deep_nesting_lines_are_skipped_with_file_and_line(tmp_path: Path, capsys) -> None:
    lines = _valid_lines(tmp_path)
    overflow = lines[0].replace('"intValue":"1"', '"intValue":1e400', 1)
    assert overflow != lines[0]
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join([*lines[:2], overflow, "[" * 100_000 + "]" * 100_000,
                               '{"resourceSpans":' * 50_000 + "1" + "}" * 50_000, *lines[2:]]) + "\n")
    analysis = analyze_path([path])
    err = capsys.readouterr().err
    assert f"{path}:4: skipped a corrupt or truncated line (nested too deeply)" in err
    assert f"{path}:5: skipped a corrupt or truncated line (nested too deeply)" in err
    assert "Traceback" not in err
    assert analysis.step.primary.kind.name != "NO_DATA"
    render(analysis, "text")


def _analyze_limited(*paths: Path) -> subprocess.CompletedProcess:
    """``traceml analyze`` in a child under a 2 GB address-space limit (as a small container would be)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([sys.executable, "-m", "traceml_otel.cli", "analyze", *map(str, paths)],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)


def test_special_files_in_a_run_folder_are_skipped_with_one_line_each(tmp_path: Path) -> None:
    """A FIFO, a 10 GB sparse file, a /dev/zero link and a valid file with a NUL tail, as rank files:
    the valid rank is analysed, each other file is one warning, under a 2 GB address-space limit."""
    lines = _valid_lines(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "rank-1.traces.jsonl")
    with (run / "rank-2.traces.jsonl").open("wb") as handle:
        handle.truncate(10 << 30)
    (run / "rank-3.traces.jsonl").symlink_to("/dev/zero")
    os.mkfifo(run / "manifest.json")
    os.mkfifo(run / "rank-0.export.json")
    rank0 = lines[:3]  # rank 0's first three batches
    (run / "rank-0.traces.jsonl").write_bytes(("\n".join(rank0) + "\n").encode() + b"\0" * 100_000)
    result = _analyze_limited(run)
    assert "Traceback" not in result.stderr, result.stderr
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank-1.traces.jsonl: is a FIFO (named pipe), not a regular file; not read; skipped" in text
    assert "rank-2.traces.jsonl:1: 10,737,418,240 NUL bytes of a sparse file's hole skipped at byte 0" in text
    assert "rank-3.traces.jsonl: is a character device, not a regular file; not read; skipped" in text
    assert "rank-0.traces.jsonl:4: 100,000 NUL bytes skipped" in text
    assert "manifest.json: is a FIFO" in text and "rank-0.export.json: is a FIFO" in text


@pytest.mark.parametrize("kind", ["fifo", "sparse", "zero"])
def test_a_special_file_named_directly_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "spans.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        with path.open("wb") as handle:
            handle.truncate(10 << 30)
    result = _analyze_limited(path)
    assert "Traceback" not in result.stderr and result.returncode in (1, 2), result.stderr
    if kind == "sparse":
        assert "10,737,418,240 NUL bytes of a sparse file's hole skipped" in " ".join(
            (result.stdout + result.stderr).split())
    else:
        assert len(result.stderr.strip().splitlines()) == 1 and "not a regular file" in result.stderr


def test_1e308_durations_are_bad_data_with_file_and_line(tmp_path: Path, capsys) -> None:
    lines = _valid_lines(tmp_path)
    huge = lines[1].replace('"doubleValue":', '"doubleValue":1e308,"x":', 2)
    assert huge != lines[1]
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join([lines[0], huge, *lines[2:]]) + "\n")
    analysis = analyze_path([path])
    err = capsys.readouterr().err
    assert f"{path}:2: 2 duration value(s) out of range" in err, err
    json.loads(render(analysis, "json"))  # no ValueError: every number is finite
    render(analysis, "text")
    render(analysis, "html")
