"""Collective timing in one process (gloo, world size 1): DDP's gradient buckets, explicit
``torch.distributed`` calls, nesting, hooks the program registers, and the off switches."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.capture.list_sink import ListSink
from traceml_otel.capture.collectives import CollectiveTiming, payload_bytes
from traceml_otel.capture.device_clock import CpuClock
from traceml_otel.capture.recorder import StepRecorder


@pytest.fixture
def world(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    gc.collect()  # a test's DDP model (its reducer holds the group) dies before the group, never after
    dist.destroy_process_group()


@pytest.fixture
def timing():
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    warnings: list[str] = []
    collectives = CollectiveTiming(recorder, warnings.append)
    collectives.install()
    yield sink, recorder, collectives, warnings
    collectives.uninstall()


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _step(recorder: StepRecorder, model: nn.Module, extra=None) -> None:
    recorder.begin_step()
    model(torch.ones(2, 16)).sum().backward()
    if extra is not None:
        extra()
    recorder.end_step()


def test_ddp_buckets_are_timed_with_the_gradient_bytes(world, timing) -> None:
    sink, recorder, collectives, warnings = timing
    ddp = DistributedDataParallel(_model())
    collectives.watch(ddp)
    collectives.watch(ddp)  # once per model
    for _ in range(3):
        _step(recorder, ddp)
    recorder.flush()
    records = sink.records()
    assert len(records) == 3 and not warnings
    for record in records:
        assert record.collectives, "every step's gradient sync is recorded"
        assert {c.source for c in record.collectives} == {"ddp"}
        assert {c.kind for c in record.collectives} == {"all_reduce"}
        assert sum(c.nbytes for c in record.collectives) == _gradient_bytes(ddp)
        for c in record.collectives:
            assert c.end_ns is not None and c.end_ns >= c.start_ns and not c.blocking
            assert c.gpu_offset_ns is None and c.gpu_duration_ns is None  # CPU: missing, not zero


def test_ddp_gradients_still_average_correctly_through_the_hook(world, timing) -> None:
    _sink, recorder, collectives, _ = timing
    torch.manual_seed(0)
    plain = _model()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(_model())
    collectives.watch(ddp)
    _step(recorder, ddp)
    plain(torch.ones(2, 16)).sum().backward()
    for mine, theirs in zip(ddp.module.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(mine.grad, theirs.grad)


def test_explicit_calls_inside_the_step_are_timed_once(world, timing) -> None:
    sink, recorder, _collectives, _ = timing
    dist.all_reduce(torch.ones(3))  # outside a step: not recorded
    recorder.begin_step()
    dist.all_reduce(torch.ones(5))
    dist.barrier()
    work = dist.all_reduce(torch.ones(7), async_op=True)
    work.wait()
    dist.all_gather_single(torch.empty(4), torch.ones(4))
    dist.all_gather_object([None], {"a": 1})  # runs other collectives inside: counted once
    recorder.end_step()
    recorder.flush()
    (record,) = sink.records()
    calls = [(c.kind, c.source, c.nbytes, c.blocking) for c in record.collectives]
    assert calls[:4] == [
        ("all_reduce", "api", 20, True),
        ("barrier", "api", 0, True),
        ("all_reduce", "api", 28, False),
        ("all_gather", "api", 16, True),
    ]
    assert calls[4] == ("all_gather", "api", 0, True) and len(calls) == 5
    assert all(c.end_ns is not None and c.end_ns >= c.start_ns for c in record.collectives)


def test_a_failing_collective_propagates_and_is_still_closed(world, timing) -> None:
    sink, recorder, _, _ = timing
    recorder.begin_step()
    with pytest.raises((RuntimeError, ValueError)):
        dist.broadcast(torch.ones(2), src=5)  # no rank 5 in a world of one
    recorder.end_step()
    recorder.flush()
    (record,) = sink.records()
    (call,) = record.collectives
    assert call.kind == "broadcast" and call.end_ns is not None


def test_a_hook_registered_after_ours_runs_inside_it(world, timing) -> None:
    sink, recorder, collectives, _ = timing
    ddp = DistributedDataParallel(_model())
    collectives.watch(ddp)
    seen = []

    def my_hook(state, bucket):
        seen.append(state)
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook("mine", my_hook)  # would raise "only once" without the redirect
    _step(recorder, ddp)
    recorder.flush()
    (record,) = sink.records()
    assert seen == ["mine"]
    assert [(c.kind, c.source) for c in record.collectives] == [("custom", "ddp")]  # inner all_reduce once


def test_a_hook_registered_before_is_reported_once_and_training_continues(world) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = DistributedDataParallel(_model())  # built and hooked before collective timing starts
    ddp.register_comm_hook(None, allreduce_hook)
    other = DistributedDataParallel(_model())
    other.register_comm_hook(None, allreduce_hook)
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    warnings: list[str] = []
    collectives = CollectiveTiming(recorder, warnings.append)
    collectives.install()
    try:
        collectives.watch(ddp)
        collectives.watch(other)
        _step(recorder, ddp)
    finally:
        collectives.uninstall()
    recorder.flush()
    (record,) = sink.records()
    # Not a DDP bucket; the hook's own asynchronous dist.all_reduce is still seen, exposed part unknown.
    assert [(c.source, c.kind, c.blocking) for c in record.collectives] == [("api", "all_reduce", False)]
    assert len(warnings) == 1 and "allreduce_hook" in warnings[0] and "not timed" in warnings[0]


def test_uninstall_restores_torch_distributed() -> None:
    original, ddp_init = dist.all_reduce, DistributedDataParallel.__init__
    collectives = CollectiveTiming(StepRecorder(ListSink()), print)
    collectives.install()
    assert dist.all_reduce is not original and dist.all_reduce.__traceml_original__ is original
    assert DistributedDataParallel.__init__ is not ddp_init
    collectives.uninstall()
    assert dist.all_reduce is original and DistributedDataParallel.__init__ is ddp_init


def test_payload_bytes() -> None:
    assert payload_bytes(torch.ones(3, dtype=torch.float64)) == 24
    assert payload_bytes([torch.ones(2), torch.ones(2, dtype=torch.int8)]) == 10
    assert payload_bytes(None) == 0


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    full_env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=60, check=False)


_DDP_SCRIPT = """
    import torch, torch.distributed as dist, traceml_otel as traceml
    from torch.nn.parallel import DistributedDataParallel
    traceml.init({arguments})
    dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    for _ in range(3):
        with traceml.trace_step(model):
            model(torch.ones(2, 8)).sum().backward()
            dist.all_reduce(torch.ones(1))
    traceml.shutdown()
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("arguments", "env", "timed"),
    [
        ("", {}, True),
        ("collectives=False", {}, False),
        ("", {"TRACEML_COLLECTIVES": "0"}, False),
        ("mode='manual'", {}, False),
    ],
)
def test_collective_timing_is_on_by_default_and_can_be_turned_off(tmp_path, arguments, env, timed) -> None:
    from tests.local_copy_reader import read_run

    script = _DDP_SCRIPT.replace("{store}", str(tmp_path / "store")).replace("{arguments}", arguments)
    result = _python(script, tmp_path, **env)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    steps = [s for s in spans if s.name == "traceml.step"]
    collectives = [s for s in spans if s.name == "traceml.collective"]
    assert len(steps) == 3
    if timed:
        assert {(s.attributes["traceml.collective.source"], s.attributes["traceml.collective.kind"])
                for s in collectives} == {("ddp", "all_reduce"), ("api", "all_reduce")}
        assert all(s.attributes["traceml.communication.calls"] == 2 for s in steps)
        assert all(s.attributes["traceml.communication.bytes"] == 8 * 8 * 4 + 8 * 4 + 4 for s in steps)
    else:
        assert collectives == []
        assert not any("traceml.communication.calls" in s.attributes for s in steps)


def test_a_blocking_call_on_a_side_stream_is_not_claimed_exposed(world) -> None:
    class SideStreamClock(CpuClock):
        def on_default_stream(self) -> bool:
            return False

    sink = ListSink()
    recorder = StepRecorder(sink, SideStreamClock(), flush_steps=1000)
    collectives = CollectiveTiming(recorder, print)
    collectives.install()
    try:
        recorder.begin_step()
        dist.all_reduce(torch.ones(2))
        recorder.end_step()
    finally:
        collectives.uninstall()
    recorder.flush()
    (record,) = sink.records()
    assert [(c.kind, c.blocking) for c in record.collectives] == [("all_reduce", False)]


def test_fsdp_all_gather_and_reduce_scatter_are_captured_on_two_ranks(tmp_path) -> None:
    from tests.local_copy_reader import read_run

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    repo = Path(__file__).resolve().parents[2]
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"),
               PYTHONPATH=os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p))
    script = Path(__file__).parent / "scripts" / "fsdp_loop.py"
    result = subprocess.run(
        [sys.executable, "-m", "traceml_otel.cli", "run", str(script), "--nproc-per-node", "2"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    steps = [s.attributes for s in spans if s.name == "traceml.step"]
    assert len(steps) == 8 and {s["traceml.parallelism"] for s in steps} == {"fsdp"}
    kinds: dict[tuple[int, int], set[str]] = {}
    for span in spans:
        if span.name == "traceml.collective":
            a = span.attributes
            assert a["traceml.collective.source"] == "api" and a["traceml.collective.bytes"] > 0
            key = (a["traceml.rank"], a["traceml.step.number"])
            kinds.setdefault(key, set()).add(a["traceml.collective.kind"])
    assert len(kinds) == 8 and all(found == {"all_gather", "reduce_scatter"} for found in kinds.values())


def test_timing_that_cannot_install_is_reported_once_and_training_continues(tmp_path) -> None:
    code = """
        import torch, traceml_otel as traceml
        from traceml_otel.capture import collectives
        def broken(self):
            raise RuntimeError("no distributed here")
        collectives.CollectiveCallPatch.install = broken
        assert traceml.init()
        model = torch.nn.Linear(4, 1)
        for _ in range(3):
            with traceml.trace_step(model):
                model(torch.ones(2, 4)).sum().backward()
        traceml.shutdown()
        print("trained")
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0 and "trained" in result.stdout, result.stderr
    assert result.stderr.count("collective timing is off") == 1 and "no distributed here" in result.stderr


def test_a_ddp_model_built_after_install_is_timed_and_wraps_the_programs_hook(world, timing) -> None:
    sink, recorder, _, warnings = timing
    ddp = DistributedDataParallel(_model())  # no watch(): the constructor hooks it

    def my_hook(state, bucket):
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, my_hook)  # right after construction, the common place
    _step(recorder, ddp)
    recorder.flush()
    (record,) = sink.records()
    assert [(c.kind, c.source) for c in record.collectives] == [("custom", "ddp")] and not warnings
    assert sum(c.nbytes for c in record.collectives) == _gradient_bytes(ddp)
