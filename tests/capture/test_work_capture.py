"""Work per step and loader settings on the capture side; nested blocks; init() mismatches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.capture.test_hooks import ListSink
from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.capture import hooks
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.step_records import LoaderSettings


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        (torch.zeros(16, 3), 16),
        ((torch.zeros(8, 2), torch.zeros(8)), 8),
        ([torch.zeros(5)], 5),
        ({"input_ids": torch.zeros(4, 128), "labels": torch.zeros(4)}, 4),
        ([[torch.zeros(3, 1)]], 3),
        (torch.tensor(1.0), None),  # 0-d: no batch dimension
        ("text", None),
        ([], None),
        ({}, None),
    ],
)
def test_batch_samples_reads_the_leading_dimension(batch: object, samples: int | None) -> None:
    assert hooks.batch_samples(batch) == samples


def _loop(recorder: StepRecorder, loader: torch.utils.data.DataLoader, steps: int) -> None:
    # range first: zip stops without fetching beyond the last step
    for _step, _batch in zip(range(steps), loader, strict=False):
        recorder.begin_step()
        recorder.end_step()


def test_loader_batches_become_samples_and_settings_go_out_once() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    patch = hooks.DataLoaderPatch(recorder)
    patch.install()
    try:
        data = torch.utils.data.TensorDataset(torch.zeros(40, 2))
        loader = torch.utils.data.DataLoader(data, batch_size=16)  # 16, 16, then a last batch of 8
        _loop(recorder, loader, 3)
        _loop(recorder, loader, 1)  # a second epoch: a new iterator, same settings: not sent again
        recorder.begin_step()  # a step with no fetch before it has no sample count
        recorder.end_step()
        recorder.flush()
    finally:
        patch.uninstall()
    records = sink.records()
    assert [r.samples for r in records] == [16, 16, 8, 16, None]
    assert records[0].loader == LoaderSettings(0, False, False, None, 16, "TensorDataset")
    assert [r.loader is not None for r in records] == [True, False, False, False, False]


def test_last_fetch_before_a_step_counts_and_fetches_inside_add_up() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    recorder.fetch_end(recorder.fetch_begin(), 100)  # e.g. an evaluation batch in between
    recorder.fetch_end(recorder.fetch_begin(), 8)
    recorder.begin_step()
    recorder.fetch_end(recorder.fetch_begin(), 8)  # a micro-batch fetched inside the step
    recorder.end_step()
    recorder.fetch_end(recorder.fetch_begin(), 8)
    recorder.begin_step(samples=3, tokens=300)  # declared work wins
    recorder.end_step()
    recorder.flush()
    first, second = sink.records()
    assert (first.samples, first.tokens) == (16, None)
    assert (second.samples, second.tokens) == (3, 300)


def test_nested_blocks_are_not_steps() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    assert recorder.begin_step() is True
    assert recorder.begin_step() is False
    recorder.end_step()
    recorder.flush()
    assert len(sink.records()) == 1 and recorder.nested_steps == 1


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_public_api_nesting_samples_and_init_mismatch(tmp_path: Path) -> None:
    result = _python("""
        import torch
        import traceml_otel as traceml
        traceml.init()
        model = torch.nn.Linear(2, 1)
        for step in range(3):
            with traceml.trace_step(model, samples=4, tokens=40):
                with traceml.trace_step(model):  # e.g. a helper that traces its own step
                    model(torch.zeros(4, 2)).sum().backward()
        try:
            traceml.init(mode="manual")
        except RuntimeError as error:
            print("ERROR", error)
        traceml.shutdown()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("blocks are nested") == 1  # warned once
    assert "ERROR traceml.init() was already called with a different configuration: mode: 'auto' then " \
           "'manual'" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    steps = [s for s in read_run(run_dir) if s.name == c.SPAN_STEP]
    assert [s.attributes[c.ATTR_STEP] for s in steps] == [0, 1, 2]  # counted once
    assert {(s.attributes[c.ATTR_STEP_SAMPLES], s.attributes[c.ATTR_STEP_TOKENS]) for s in steps} == {(4, 40)}
    assert steps[0].attributes[c.ATTR_HOST_CPUS] >= 1 and c.ATTR_HOST_CPUS not in steps[1].attributes
    forwards = [s for s in read_run(run_dir) if s.name == "traceml.forward"]
    assert len(forwards) == 3


def test_trace_step_rejects_garbage_work() -> None:
    import traceml_otel as traceml

    with pytest.raises(TypeError):
        traceml.trace_step(None, samples="many")
    with pytest.raises(ValueError):
        traceml.trace_step(None, samples=-1)
