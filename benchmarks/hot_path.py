"""Training-thread cost of each capture piece, in isolation (CPU).

    .venv/bin/python benchmarks/hot_path.py

Times tight loops of a tiny module call, a backward, an optimizer step and a DataLoader ``next()``
with and without each hook, an empty ``begin_step``/``end_step`` pair, and a step with three phase
calls whose batches are encoded into pipe frames as the emitter channel does on the training thread,
taking the best of five repeats (of seven alternating blocks with and without a hook) so machine
noise mostly drops out. Each is the calling thread's CPU
time (``time.thread_time_ns``), not wall time: on a shared machine a preemption would otherwise land
in whichever loop it hit. The emitter is not involved (a
sink that discards).
The DataLoader case includes reading the batch dimension and checking for a new iterator.
Accelerate's optimizer step and backward are timed too when ``accelerate`` is installed. Last, an
empty ``trace_step()`` block through the public API (facade and training session) with a real
``init(mode="auto")``, and a whole ~0.5 ms iteration of ``overhead_pairs.py``'s loop traced that way
against the same iteration before ``init()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from traceml_otel.capture import accelerate_hooks, hooks
from traceml_otel.capture.recorder import StepRecorder
from traceml_otel.wire.frames import encode_steps


class Discard:
    def send_steps(self, rows: list) -> None:
        pass


class EncodeFrames:
    """The training thread's share of the real hand-off: each batch becomes one pipe frame."""

    def send_steps(self, rows: list) -> None:
        encode_steps(rows)


def per_call_us(fn: Callable[[], object], calls: int = 20_000, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - started) / calls / 1000)
    return best


def paired_us(
    fn: Callable[[], object], install: Callable[[], None], uninstall: Callable[[], None], calls: int = 20_000,
) -> tuple[float, float]:
    """Best per-call CPU without and with a hook, the two measured in alternating blocks (seven of
    each), so a slow spell of the machine hits both alike."""
    bare = hooked = float("inf")
    for _ in range(7):
        bare = min(bare, per_call_us(fn, calls, repeats=1))
        install()
        try:
            hooked = min(hooked, per_call_us(fn, calls, repeats=1))
        finally:
            uninstall()
    return bare, hooked


def main() -> None:
    torch.set_num_threads(1)
    recorder = StepRecorder(Discard(), flush_steps=64)
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def forward() -> None:
        model(x)

    def backward() -> None:
        model(x).sum().backward()

    def empty_step() -> None:
        recorder.begin_step()
        recorder.end_step()

    print(f"begin_step + end_step (incl. batch hand-off): {per_call_us(empty_step):6.2f} us")
    framed = StepRecorder(EncodeFrames(), flush_steps=64)

    def phased_step() -> None:
        framed.begin_step()
        for phase in ("forward", "backward", "optimizer"):
            framed.phase_end(phase, framed.phase_begin())
        framed.end_step()

    print(f"step with 3 phase calls + frame encoding:     {per_call_us(phased_step):6.2f} us")
    data = torch.utils.data.TensorDataset(torch.zeros(16 * 1024, 4), torch.zeros(16 * 1024))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    batches = iter(())

    def fetch() -> None:
        nonlocal batches
        try:
            next(batches)
        except StopIteration:
            batches = iter(loader)
            next(batches)

    loader_patch = hooks.DataLoaderPatch(recorder)
    batch = (torch.zeros(16, 4), torch.zeros(16))
    print(f"batch_samples((x, y)) per fetch: {per_call_us(lambda: hooks.batch_samples(batch)):6.2f} us")
    token = recorder.fetch_begin()
    print(f"fetch_end with samples:            {per_call_us(lambda: recorder.fetch_end(token, 16)):6.2f} us")
    print(f"fetch_end without (before v2):     {per_call_us(lambda: recorder.fetch_end(token)):6.2f} us")
    recorder.begin_step()  # phases below are recorded inside one open step
    forward_hooks = hooks.ForwardHooks(recorder)
    backward_patch = hooks.BackwardPatch(recorder)
    optimizer_hooks = hooks.OptimizerHooks(recorder)
    cases = [
        ("forward hook", forward, lambda: forward_hooks.watch(model), forward_hooks.uninstall),
        ("backward patch", backward, backward_patch.install, backward_patch.uninstall),
        ("optimizer hooks", lambda: optimizer.step(), optimizer_hooks.install, optimizer_hooks.uninstall),
        ("dataloader next", fetch, loader_patch.install, loader_patch.uninstall),
    ]
    for name, call, install, uninstall in cases:
        bare, hooked = paired_us(call, install, uninstall)
        recorder.end_step()
        recorder.begin_step()
        print(f"{name:<16} bare {bare:7.2f} us   hooked {hooked:7.2f} us   added {hooked - bare:+6.2f} us")
    recorder.end_step()
    accelerate_case(recorder, model, x)
    own_code_case()
    inferred_case()


def accelerate_case(recorder: StepRecorder, model: nn.Module, x: torch.Tensor) -> None:
    """Accelerate's ``optimizer.step()`` and ``accelerator.backward``, timed from the outside."""
    try:
        from accelerate import Accelerator
    except ImportError:
        print("accelerate not installed: Accelerate lines skipped")
        return
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer_hooks = hooks.OptimizerHooks(recorder)
    backward_patch = hooks.BackwardPatch(recorder)
    patch = accelerate_hooks.AccelerateCallsPatch(optimizer_hooks, backward_patch)
    cases = [
        ("Accelerate step", lambda: prepared.step()),
        ("acc. backward", lambda: accelerator.backward(model(x).sum())),
    ]
    def install() -> None:
        optimizer_hooks.install()
        backward_patch.install()
        patch.install()

    def uninstall() -> None:
        patch.uninstall()
        backward_patch.uninstall()
        optimizer_hooks.uninstall()

    for name, call in cases:
        bare, hooked = paired_us(call, install, uninstall, calls=5_000)
        recorder.end_step()
        recorder.begin_step()
        print(f"{name:<16} bare {bare:7.2f} us   hooked {hooked:7.2f} us   added {hooked - bare:+6.2f} us")


def own_code_case() -> None:
    """Telemetry's own Python in one step of the ``overhead_pairs.py`` loop, with every piece of torch
    work replaced by a no-op, so only our code runs (a ~10 us loop that load hardly moves, unlike a
    whole iteration's 0.5 ms): the DataLoader ``next()`` wrapper (around a ``next`` that returns a
    batch), a step's enter and exit, the forward pre-hook and hook (called as torch calls them; torch's
    own hook dispatch, ~3 us, is in the forward hook line above), the backward patch around a no-op,
    the optimizer wrapper around a step that runs torch's global step hooks, and the batch hand-off
    as pipe frames."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    recorder = StepRecorder(EncodeFrames(), flush_steps=64)
    forward, backward, optimizer_hooks = (
        hooks.ForwardHooks(recorder), hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder))
    timed_backward = backward.timed(lambda *args, **kwargs: None)

    def torch_step(*args: object, **kwargs: object) -> None:  # torch's wrapper: its global hooks
        optimizer_hooks.pre(None, args, kwargs)
        optimizer_hooks.post(None, args, kwargs)

    timed_step = optimizer_hooks._timed_step(torch_step)
    batch = (torch.zeros(16, 4), torch.zeros(16))

    class Batches(_BaseDataLoaderIter):
        def __init__(self) -> None:  # none of torch's state: only next() is called
            pass

    original_next = _BaseDataLoaderIter.__next__
    _BaseDataLoaderIter.__next__ = lambda self: batch  # type: ignore[method-assign]
    loader_patch = hooks.DataLoaderPatch(recorder)
    loader_patch.install()
    iterator = Batches()

    def step() -> None:
        next(iterator)
        recorder.begin_step()
        forward.before_forward(None, ())
        forward.after_forward(None, (), None)
        timed_backward()
        timed_step()
        recorder.end_step()

    def forward_pair() -> None:
        forward.before_forward(None, ())
        forward.after_forward(None, (), None)

    def with_step(piece: Callable[[], object]) -> Callable[[], None]:
        def one() -> None:
            recorder.begin_step()
            piece()
            recorder.end_step()
        return one

    try:
        print(f"our code per step (loop with no-op torch): {per_call_us(step):6.2f} us")
        empty = per_call_us(with_step(lambda: None))
        parts = [("DataLoader next()", per_call_us(lambda: next(iterator))), ("step enter/exit", empty)]
        parts += [(name, per_call_us(with_step(piece)) - empty) for name, piece in (
            ("forward hooks", forward_pair), ("backward patch", timed_backward), ("optimizer", timed_step))]
        print("  of which: " + ", ".join(f"{name} {us:.2f} us" for name, us in parts))
    finally:
        loader_patch.uninstall()
        _BaseDataLoaderIter.__next__ = original_next  # type: ignore[method-assign]


def inferred_case() -> None:
    """A whole training iteration (forward, backward, optimizer step) with every hook on: in a
    ``trace_step`` block, and with its step inferred instead (after the warm-up: hooks on the model
    alone), against the bare iteration."""
    from types import SimpleNamespace

    from traceml_otel.capture.inferred_steps import WARM_UP_STEPS, InferredSteps

    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    bare = per_call_us(iteration, calls=5_000)
    results = {}
    for mode in ("trace_step", "inferred"):
        recorder = StepRecorder(Discard(), flush_steps=64)
        forward, backward, optimizer_hooks = (
            hooks.ForwardHooks(recorder), hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder))
        backward.install()
        optimizer_hooks.install()
        forward.watch(model)
        telemetry = SimpleNamespace(recorder=recorder, forward=forward, optimizer_hooks=optimizer_hooks,
                                    config=SimpleNamespace(optimizer=True), inferred=None,
                                    model_seen=forward.watch)
        inferred = InferredSteps(telemetry)
        if mode == "inferred":
            inferred.start()
            for _ in range(WARM_UP_STEPS):  # past the warm-up: hooks on the model only
                iteration()

            def step(recorder: StepRecorder = recorder) -> None:
                iteration()
        else:
            def step(recorder: StepRecorder = recorder) -> None:
                recorder.begin_step()
                iteration()
                recorder.end_step()
        results[mode] = per_call_us(step, calls=5_000)
        inferred.stop()
        optimizer_hooks.uninstall()
        backward.uninstall()
        forward.uninstall()
    print(f"iteration        bare {bare:7.2f} us   trace_step {results['trace_step']:7.2f} us   "
          f"inferred {results['inferred']:7.2f} us   inferred - trace_step "
          f"{results['inferred'] - results['trace_step']:+6.2f} us")


def api_case() -> None:
    """``with traceml.trace_step(model):`` through the public API (facade, session, recorder) with a real
    ``init(mode="auto")`` (its emitter process receives the steps; no local copy, no OTLP): an empty
    block, and a whole iteration of the ``overhead_pairs.py`` loop (DataLoader ``next()``, zero_grad,
    forward, loss, backward, optimizer step; ~0.5 ms) against the same iteration before ``init()``."""
    import os
    import tempfile

    import traceml_otel as traceml

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256 * 32, 64), torch.randint(0, 10, (256 * 32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    batches = iter(())

    def iteration() -> None:
        nonlocal batches
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    bare = per_call_us(iteration, calls=2_000)
    with tempfile.TemporaryDirectory() as runs:
        os.environ.update(TRACEML_RUNS_DIR=runs, TRACEML_LOCAL_COPY="0", TRACEML_HANG_TIMEOUT_S="0")
        for name in [k for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP")]:
            del os.environ[name]
        assert traceml.init(mode="auto", collectives=False, strict=True)

        def api_step() -> None:
            with traceml.trace_step(model):
                pass

        def traced() -> None:
            with traceml.trace_step(model):
                iteration()

        print(f"trace_step() block via the public API:        {per_call_us(api_step):6.2f} us")
        hooked = per_call_us(traced, calls=2_000)
        print(f"API iteration    bare {bare:7.2f} us   traced {hooked:7.2f} us   "
              f"added {hooked - bare:+6.2f} us")
        traceml.shutdown()


if __name__ == "__main__":
    main()
    api_case()
