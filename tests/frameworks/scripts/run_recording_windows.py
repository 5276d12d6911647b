"""Run an example script while recording when evaluation and checkpoints happened (test helper).

    python run_recording_windows.py EXAMPLE.py [example args]

Writes ``$WINDOWS_DIR/rank-<R>.json``: ``[[kind, start_ns, end_ns], ...]`` on the epoch clock:
the HF Trainer's ``evaluate`` and ``_save_checkpoint``, Lightning's evaluation loop, and for a
hand-written loop the time from a model's ``eval()`` to its next ``train()``.
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

windows: list[list] = []


def _record(owner: type, name: str, kind: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def recorded(*args, **kwargs):
        started = time.time_ns()
        try:
            return original(*args, **kwargs)
        finally:
            windows.append([kind, started, time.time_ns()])

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
                opened.append(time.time_ns())
            elif depth[0] == 0 and mode and opened:
                windows.append(["evaluation", opened.pop(), time.time_ns()])

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
    else:
        _record_eval_to_train()


def _write() -> None:
    out = Path(os.environ["WINDOWS_DIR"]) / f"rank-{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps(windows))


if __name__ == "__main__":
    script = sys.argv[1]
    _install(Path(script).read_text())
    atexit.register(_write)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")
