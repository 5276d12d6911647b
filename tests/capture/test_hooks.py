"""Automatic hooks feed the recorder: phase names, call counts, durations, no double counting."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.capture.list_sink import ListSink
from tests.tools import import_or_missing
from traceml_otel.capture import accelerate_hooks, hooks
from traceml_otel.capture.recorder import StepRecorder


class SlowLinear(nn.Module):
    """A module whose forward sleeps, with a nested sub-module that also runs."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return self.inner(x)


class SlowBackward(torch.autograd.Function):
    sleep_s = 0.0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SlowBackward.sleep_s)
        return grad


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.ones(4)


@pytest.fixture
def recorder_and_hooks():
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    installed = [
        hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder), hooks.DataLoaderPatch(recorder)
    ]
    for hook in installed:
        hook.install()
    forward = hooks.ForwardHooks(recorder)
    yield sink, recorder, forward
    for hook in installed:
        hook.uninstall()
    forward.uninstall()


def _train_steps(recorder, forward, model, loader, optimizer, steps, sleeps=(0.0, 0.0)) -> None:
    backward_sleep, optimizer_sleep = sleeps
    SlowBackward.sleep_s = backward_sleep
    forward.watch(model)
    iterator = iter(loader)
    for _ in range(steps):
        batch = next(iterator)
        recorder.begin_step()
        optimizer.zero_grad()
        loss = SlowBackward.apply(model(batch)).sum()
        loss.backward()
        if optimizer_sleep:
            time.sleep(optimizer_sleep)  # outside any phase: residual
        optimizer.step()
        recorder.end_step()
    recorder.flush()


def test_phase_durations_follow_injected_sleeps(recorder_and_hooks) -> None:
    sink, recorder, forward = recorder_and_hooks
    model = SlowLinear(0.02)
    loader = torch.utils.data.DataLoader(SlowDataset(0.005), batch_size=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train_steps(recorder, forward, model, loader, optimizer, steps=4, sleeps=(0.03, 0.01))
    records = sink.records()
    assert [r.step for r in records] == [0, 1, 2, 3]
    for record in records:
        by_phase = {p.phase: p for p in record.phases}
        assert set(by_phase) == {"forward", "backward", "optimizer"}
        forward_s = (by_phase["forward"].end_ns - by_phase["forward"].start_ns) / 1e9
        backward_s = (by_phase["backward"].end_ns - by_phase["backward"].start_ns) / 1e9
        assert 0.02 <= forward_s < 0.2
        assert 0.03 <= backward_s < 0.3
        assert record.input_wait_ns is not None and 0.01 <= record.input_wait_ns / 1e9 < 0.2  # 2 items x 5 ms
        assert record.input_fetches == 1
        step_s = (record.end_ns - record.start_ns) / 1e9
        assert step_s >= forward_s + backward_s + 0.01
        assert record.optimizer_steps == 1
        assert record.clock == "cpu" and record.gpu_duration_ns is None and record.peak_reserved_bytes is None


def test_nested_modules_and_wrappers_count_once(recorder_and_hooks) -> None:
    sink, recorder, forward = recorder_and_hooks
    inner = SlowLinear(0.0)
    outer = nn.Sequential(inner, nn.ReLU())
    forward.watch(inner)  # both the wrapper and its inner module are traced
    loader = [torch.ones(2, 4)] * 3
    optimizer = torch.optim.SGD(outer.parameters(), lr=0.1)
    _train_steps(recorder, forward, outer, loader, optimizer, steps=3)
    for record in sink.records():
        assert [p.phase for p in record.phases].count("forward") == 1
        assert [p.phase for p in record.phases].count("backward") == 1


def test_several_calls_of_a_phase_are_all_kept(recorder_and_hooks) -> None:
    sink, recorder, forward = recorder_and_hooks
    model = nn.Linear(4, 1)
    forward.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder.begin_step()
    for _ in range(3):  # three micro-batches inside one block
        model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    recorder.end_step()
    recorder.flush()
    (record,) = sink.records()
    forwards = [p for p in record.phases if p.phase == "forward"]
    assert [p.call for p in forwards] == [0, 1, 2]
    assert [p.call for p in record.phases if p.phase == "backward"] == [0, 1, 2]


def test_autograd_backward_and_tensor_backward_count_once(recorder_and_hooks) -> None:
    sink, recorder, _ = recorder_and_hooks
    x = torch.ones(3, requires_grad=True)
    recorder.begin_step()
    torch.autograd.backward((x * 2).sum())
    (x * 3).sum().backward()  # Tensor.backward calls torch.autograd.backward inside
    recorder.end_step()
    recorder.flush()
    (record,) = sink.records()
    assert [p.phase for p in record.phases] == ["backward", "backward"]


def test_ddp_wrapper_forward_counted_once(recorder_and_hooks, tmp_path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sink, recorder, forward = recorder_and_hooks
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(SlowLinear(0.0))
        forward.watch(ddp)
        forward.watch(ddp.module)
        assert hooks.parallelism_of(ddp) == "ddp"
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        _train_steps(recorder, forward, ddp, [torch.ones(2, 4)] * 2, optimizer, steps=2)
    finally:
        ddp = optimizer = None  # the reducer holds the group: it dies first (a reducer freed by a later
        gc.collect()  # garbage collection joined the destroyed gloo group's threads and hung a CI worker)
        dist.destroy_process_group()
    for record in sink.records():
        assert [p.phase for p in record.phases].count("forward") == 1


def test_user_exception_propagates_and_forward_depth_recovers(recorder_and_hooks) -> None:
    sink, recorder, forward = recorder_and_hooks

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("user bug")

    model = Boom()
    forward.watch(model)
    recorder.begin_step()
    with pytest.raises(RuntimeError, match="user bug"):
        model(torch.ones(1))
    recorder.end_step("RuntimeError")
    ok = nn.Linear(1, 1)
    forward.watch(ok)
    recorder.begin_step()
    ok(torch.ones(1))
    recorder.end_step()
    recorder.flush()
    first, second = sink.records()
    assert first.exception_type == "RuntimeError"
    assert [p.phase for p in first.phases] == ["forward"]  # Boom, a class of ours: timed by its call
    assert [p.phase for p in second.phases] == ["forward"]  # nn.Linear: timed by hooks
    assert not forward.in_forward


def test_h2d_patch_times_only_matching_copies_inside_steps() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    # On CPU there is no CUDA: the predicate seam treats float64 conversions as "device copies".
    patch = hooks.HostToDevicePatch(recorder, is_h2d=lambda src, out: out.dtype == torch.float64)
    patch.install()
    try:
        x = torch.ones(256)
        x.to(torch.float64)  # outside a step: ignored
        recorder.begin_step()
        x.to(torch.float64)
        x.to(torch.float32)  # same dtype: returns x itself, not a copy
        recorder.end_step()
        recorder.flush()
    finally:
        patch.uninstall()
    (record,) = sink.records()
    assert [(p.phase, p.nbytes) for p in record.phases] == [("h2d", 256 * 4)]
    assert not hasattr(torch.Tensor.to, "__traceml_original__")  # uninstalled


def test_dataloader_fetch_inside_a_step_is_that_steps_input_wait(recorder_and_hooks) -> None:
    sink, recorder, _ = recorder_and_hooks
    loader = iter(torch.utils.data.DataLoader(SlowDataset(0.0), batch_size=1))
    next(loader)
    recorder.begin_step()
    next(loader)  # a second micro-batch, fetched inside the step
    recorder.end_step()
    recorder.begin_step()
    recorder.end_step()
    recorder.flush()
    first, second = sink.records()
    assert first.input_fetches == 2 and first.input_wait_in_step_ns  # counted, and kept apart
    assert first.input_wait_ns is not None and first.input_wait_ns >= first.input_wait_in_step_ns
    assert second.input_fetches == 0 and second.input_wait_ns is None  # missing, not zero


def test_optimizer_step_is_timed_from_outside_for_every_class() -> None:
    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    model = nn.Linear(8, 8)
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    before = torch.optim.AdamW(model.parameters())  # its class was wrapped by torch before install
    optimizer_hooks = hooks.OptimizerHooks(recorder)
    optimizer_hooks.install()

    class CustomSGD(torch.optim.SGD):
        def step(self, closure=None):
            time.sleep(0.01)
            return super().step(closure)

    after = CustomSGD(model.parameters(), lr=0.1)
    # A step pre-hook runs inside torch's own step wrapper: its 20 ms must be inside the span. (A
    # ratio of span to call time was flaky: on a loaded machine the call's own noise exceeded 20 %.)
    before.register_step_pre_hook(lambda optimizer, args, kwargs: time.sleep(0.02))
    try:
        recorder.begin_step()
        started = time.perf_counter_ns()
        before.step()
        outer_ns = time.perf_counter_ns() - started
        after.step()
        recorder.end_step()
        recorder.flush()
    finally:
        optimizer_hooks.uninstall()
    (record,) = sink.records()
    first, second = record.phases
    assert [p.phase for p in record.phases] == ["optimizer", "optimizer"] and record.optimizer_steps == 2
    assert 20_000_000 <= first.end_ns - first.start_ns <= outer_ns  # torch's own wrapper is inside the span
    assert second.end_ns - second.start_ns >= 10_000_000
    assert not hasattr(torch.optim.Adam.__dict__["step"], "__traceml_original__")  # uninstalled


def test_accelerate_loader_copies_become_prefetch_h2d_of_the_next_step() -> None:
    accelerate = import_or_missing("accelerate")
    from accelerate.data_loader import DataLoaderShard

    sink = ListSink()
    recorder = StepRecorder(sink, flush_steps=1000)
    fetches = hooks.DataLoaderPatch(recorder)
    fetches.install()
    # On CPU nothing goes to a device: the seam treats the CPU as one so the copy path runs.
    prefetch = accelerate_hooks.AcceleratePrefetchPatch(recorder, is_device=lambda device: True)
    prefetch.install()
    assert prefetch.installed and accelerate.data_loader.send_to_device.__wrapped__ is not None
    try:
        dataset = torch.utils.data.TensorDataset(torch.ones(8, 4))
        loader = DataLoaderShard(dataset, batch_size=2, device=torch.device("cpu"))
        for _ in loader:
            recorder.begin_step()
            recorder.end_step()
        recorder.flush()
    finally:
        prefetch.uninstall()
        fetches.uninstall()
    records = sink.records()
    assert len(records) == 4
    for record in records:
        assert record.prefetch_h2d_ns is not None and record.prefetch_h2d_ns > 0
        assert record.input_fetches >= 1
    assert not hasattr(accelerate.data_loader.send_to_device, "__wrapped__")


def test_global_optimizer_hooks_only_when_an_optimizer_predates_them() -> None:
    """In a fresh process no optimizer exists before install: torch's global step hooks stay
    unregistered (two calls fewer per step). Once one existed (its LR scheduler holds an older
    ``step`` on the instance), they are the fallback, and every step still counts once."""
    report = _fallback_script()
    assert report["fresh_global_hooks"] is False
    assert report["fresh"] == [[["optimizer"], 1]]
    assert report["restored"] is True  # a class first used while installed gets torch's step back
    assert report["late_global_hooks"] is True
    assert report["late"] == [[["optimizer"], 1], [["optimizer"], 1]]


def test_optimizers_known_from_the_start_get_their_held_step_wrapped_not_global_hooks() -> None:
    """Zero-code tracing records every optimizer from the moment torch is imported: the ``step`` an LR
    scheduler put on the instance before install gets the outer wrapper (no global hooks), counts once,
    reports its optimizer to step inference, is given back at uninstall, and holds the optimizer only
    weakly (freed without a garbage collection, as torch's scheduler arranges)."""
    assert _fallback_script("known") == {
        "global_hooks": False, "held_steps": 1, "steps": [[["optimizer"], 1], [["optimizer"], 1]],
        "updated_is_the_optimizer": True, "held_step_restored": True, "freed_without_gc": True}


def _fallback_script(*args: str) -> dict[str, object]:
    """``scripts/optimizer_hooks_fallback.py`` in a fresh process (no optimizer class used yet);
    a UserWarning (the scheduler's "optimizer.step() overridden") fails it."""
    root = Path(__file__).resolve().parents[2]
    script = Path(__file__).resolve().parent / "scripts" / "optimizer_hooks_fallback.py"
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", str(script), *args], cwd=root,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)
