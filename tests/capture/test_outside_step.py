"""``traceml.outside_step``: evaluation and checkpoints between steps feed no step's input wait."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import traceml_otel as traceml
from tests.capture.list_sink import ListSink
from tests.local_copy_reader import read_spans
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.wire.step_row import decode_step


def _fetch(recorder: StepRecorder, samples: int = 4) -> None:
    recorder.fetch_end(recorder.fetch_begin(), samples)


def _step(recorder: StepRecorder) -> None:
    recorder.begin_step()
    recorder.end_step()


def test_fetches_inside_the_block_feed_no_step_and_fetches_before_it_still_do() -> None:
    recorder = StepRecorder(ListSink())
    _fetch(recorder)
    _step(recorder)
    _fetch(recorder, samples=8)  # the next training batch, fetched before evaluation
    recorder.enter_outside("evaluation")
    recorder.loader_seen(("evaluation loader",))
    for _ in range(5):
        _fetch(recorder, samples=2)
    recorder.add_prefetch_h2d(1_000)
    recorder.exit_outside()
    _step(recorder)
    _fetch(recorder)  # no marker: today's behaviour, every fetch between steps is input wait
    _fetch(recorder)
    _step(recorder)
    recorder.flush()
    steps = [decode_step(row, 0) for row in recorder.sink.rows]
    assert [s.input_fetches for s in steps] == [1, 1, 2]
    assert steps[1].samples == 8  # the training batch's, not the evaluation batches'
    assert steps[1].prefetch_h2d_ns is None and steps[1].loader is None
    assert recorder.outside_fetches == 5 and recorder.outside == []


def test_blocks_nest_and_an_unmatched_exit_is_harmless() -> None:
    recorder = StepRecorder(ListSink())
    recorder.exit_outside()
    recorder.enter_outside("evaluation")
    recorder.enter_outside("checkpoint")
    recorder.exit_outside()
    assert recorder.outside == ["evaluation"]
    _fetch(recorder)
    recorder.exit_outside()
    _fetch(recorder)
    _step(recorder)
    recorder.flush()
    assert decode_step(recorder.sink.rows[0], 0).input_fetches == 1


def test_outside_step_without_telemetry_is_a_no_op_and_rejects_a_nameless_block() -> None:
    with traceml.outside_step("evaluation"):
        pass

    @traceml.outside_step("checkpoint")
    def save(value: int) -> int:
        return value

    assert save(3) == 3
    with pytest.raises(TypeError, match="non-empty name"):
        traceml.outside_step("")
    with pytest.raises(TypeError, match="non-empty name"):
        traceml.outside_step(None)  # type: ignore[arg-type]


LOOP = """
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    import traceml_otel as traceml

    class Items(Dataset):
        def __init__(self, n, delay_s):
            self.n, self.delay_s = n, delay_s
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            time.sleep(self.delay_s)
            return torch.ones(4)

    traceml.init()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train = iter(DataLoader(Items(64, 0.0), batch_size=4))
    held_out = DataLoader(Items(16, 0.01), batch_size=4)  # 4 batches, at least 40 ms each

    @torch.no_grad()
    def evaluate():
        model.eval()
        for x in held_out:
            model(x)
        model.train()

    marked_evaluate = traceml.outside_step("evaluation")(evaluate)
    for step in range(8):
        x = next(train)
        with traceml.trace_step(model):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        if step == 2:
            evaluate()          # no marker, but model.eval() under no_grad: its fetches feed no step
        if step == 5:
            marked_evaluate()   # marked: step 6 waits for its own batch only
    with traceml.trace_step(model), traceml.outside_step("evaluation"):
        pass                    # misuse: warned
    print("trained")
"""


def test_a_manual_loop_with_evaluation_between_steps(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(LOOP)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr[-3000:]
    assert result.stderr.count("outside_step('evaluation') was entered inside a trace_step()") == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    steps = sorted((s for s in read_spans(run_dir / "rank-0.traces.jsonl") if s.name == "traceml.step"),
                   key=lambda s: s.attributes["traceml.step.number"])
    assert len(steps) == 9
    fetches = [s.attributes["traceml.input_wait.fetches"] for s in steps[:8]]
    # step 3: its batch only (the evaluation loader's 4 batches fed evaluation forwards, and the next()
    # that ends its loop is that loader's too: time between steps, not input wait)
    assert fetches == [1, 1, 1, 1, 1, 1, 1, 1]
    wait_ms = [s.attributes["traceml.input_wait.cpu_duration"] * 1e3 for s in steps[:8]]
    evaluation_floor_ms = 4 * 4 * 10  # 16 items slept 10 ms each
    assert wait_ms[3] < evaluation_floor_ms, wait_ms  # loose: a training batch takes microseconds
    assert wait_ms[6] < evaluation_floor_ms, wait_ms
    assert steps[3].attributes["traceml.between_steps.cpu_duration"] * 1e3 >= evaluation_floor_ms
    assert all(s.attributes["traceml.step.samples"] == 4 for s in steps[:8])
