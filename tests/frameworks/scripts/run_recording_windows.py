"""Run an example script while recording when evaluation and checkpoints happened (test helper).

    python run_recording_windows.py EXAMPLE.py [example args]

Writes ``$WINDOWS_DIR/rank-<R>.json``: ``[[kind, start_ns, end_ns], ...]`` on the epoch clock:
the HF Trainer's ``evaluate`` and ``_save_checkpoint``, Lightning's evaluation loop and
``save_checkpoint``, and for a
hand-written loop the time from a model's ``eval()`` to its next ``train()``.

Two faults a test may ask for, on one rank (``RANK``):

- ``SLOW_RANK=R SLOW_OPTIMIZER_MS=N``: rank R sleeps N ms in every torch optimizer step (a slower host);
- ``TRACE_WRAPPED_RANK=R``: rank R's callback passes the DDP wrapper to ``trace_step`` instead of the
  unwrapped model the callbacks give it.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch

from traceml_otel.capture.clock_anchor import wall_anchor_ns

windows: list[list] = []
_ANCHOR_NS = wall_anchor_ns()  # read as the trainer reads its own: a preemption between reads cannot skew it


def _now_ns() -> int:
    """The epoch clock as span times are made: a monotonic reading plus an anchor taken once (the
    wall clock alone may be slewed against the spans' clock during a run). The windows sit ~15 us
    from the steps around them, so both anchors must be exact to well under the 1 ms tolerance."""
    return _ANCHOR_NS + time.perf_counter_ns()


def _record(owner: type, name: str, kind: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def recorded(*args, **kwargs):
        started = _now_ns()
        try:
            return original(*args, **kwargs)
        finally:
            windows.append([kind, started, _now_ns()])

    setattr(owner, name, recorded)


def _record_eval_to_train() -> None:
    """A hand-written loop: evaluation runs from ``model.eval()`` to the next ``model.train()``."""
    original, depth, opened = torch.nn.Module.train, [0], []

    def train(module: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
        depth[0] += 1
        try:
            return original(module, mode)
        finally:
            depth[0] -= 1
            if depth[0] == 0 and not mode and not opened:
                opened.append(_now_ns())
            elif depth[0] == 0 and mode and opened:
                windows.append(["evaluation", opened.pop(), _now_ns()])

    torch.nn.Module.train = train  # type: ignore[method-assign]


def _install(source: str) -> None:
    if "transformers" in source:
        from transformers import Trainer

        _record(Trainer, "evaluate", "evaluation")
        _record(Trainer, "_save_checkpoint", "checkpoint")
    elif "lightning" in source:
        for package in ("lightning.pytorch", "pytorch_lightning"):
            try:
                loop = importlib.import_module(f"{package}.loops.evaluation_loop")
            except ImportError:
                continue
            _record(loop._EvaluationLoop, "run", "evaluation")
            _record(importlib.import_module(package).Trainer, "save_checkpoint", "checkpoint")
    else:
        _record_eval_to_train()


def _slow_optimizer(delay_s: float) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda *_: time.sleep(delay_s))


def _trace_wrapped() -> None:
    """The callbacks trace the unwrapped model; make this rank's trace_step get its DDP wrapper."""
    import weakref

    from torch.nn.parallel import DistributedDataParallel

    from traceml_otel.integrations._driver import StepDriver

    wrapper_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    original_init, original_begin = DistributedDataParallel.__init__, StepDriver.begin

    @functools.wraps(original_init)
    def init(wrapper, module, *args, **kwargs):
        original_init(wrapper, module, *args, **kwargs)
        wrapper_of[module] = wrapper

    def begin(driver, model, samples=None):
        # around the model itself (Accelerate) or around a module holding it (Lightning's wrapper)
        wrappers = [w for inner, w in wrapper_of.items() if any(m is model for m in inner.modules())]
        assert wrappers, f"no DDP wrapper was built around {type(model).__name__}"
        return original_begin(driver, wrappers[0], samples)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]
    StepDriver.begin = begin  # type: ignore[method-assign]


def _write() -> None:
    out = Path(os.environ["WINDOWS_DIR"]) / f"rank-{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps(windows))


if __name__ == "__main__":
    script = sys.argv[1]
    _install(Path(script).read_text())
    rank = os.environ.get("RANK", "0")
    if os.environ.get("SLOW_RANK") == rank:
        _slow_optimizer(float(os.environ["SLOW_OPTIMIZER_MS"]) / 1e3)
    if os.environ.get("TRACE_WRAPPED_RANK") == rank:
        _trace_wrapped()
    atexit.register(_write)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")
