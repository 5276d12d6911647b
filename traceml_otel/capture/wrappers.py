"""Manual capture: explicit ``wrap_*`` helpers for ``mode="manual"`` or "selective".

Each helper refuses (``ValueError``) when the matching automatic hook is already active,
because both would time the same call twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from traceml_otel.capture.hooks import batch_samples
from traceml_otel.capture.recorder import StepRecorder


class TimedFetchIterator:
    """Wraps an iterable so each ``next()`` counts as input wait of the next step."""

    def __init__(self, source: Iterable[Any] | Iterator[Any], recorder: StepRecorder) -> None:
        self._source = source
        self._iterator: Iterator[Any] | None = source if isinstance(source, Iterator) else None
        self._recorder = recorder

    def __iter__(self) -> TimedFetchIterator:
        if not isinstance(self._source, Iterator):
            self._iterator = iter(self._source)
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._source)
        token = self._recorder.fetch_begin()
        batch = None
        try:
            batch = next(self._iterator)
            return batch
        finally:
            samples = None if batch is None else batch_samples(batch)
            self._recorder.fetch_end(token, samples, batch is not None)

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


class TimedLoss:
    """A loss whose ``.backward()`` is timed; every other attribute is the tensor's."""

    def __init__(self, loss: torch.Tensor, recorder: StepRecorder) -> None:
        self._loss = loss
        self._recorder = recorder

    def backward(self, *args: Any, **kwargs: Any) -> None:
        token = self._recorder.phase_begin()
        try:
            self._loss.backward(*args, **kwargs)
        finally:
            self._recorder.phase_end("backward", token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loss, name)


class TimedTransfer:
    """An object whose ``.to(...)`` / ``.cuda(...)`` calls are timed as h2d copies."""

    def __init__(self, obj: Any, recorder: StepRecorder) -> None:
        self._obj = obj
        self._recorder = recorder

    def _timed(self, method: str, *args: Any, **kwargs: Any) -> Any:
        token = self._recorder.phase_begin()
        result = getattr(self._obj, method)(*args, **kwargs)
        nbytes = None
        if isinstance(self._obj, torch.Tensor):
            nbytes = self._obj.numel() * self._obj.element_size()
        self._recorder.phase_end("h2d", token, nbytes)
        return result

    def to(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("to", *args, **kwargs)

    def cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("cuda", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


def watch_optimizer(optimizer: torch.optim.Optimizer, pre: Any, post: Any) -> list[Any]:
    """Per-optimizer step hooks: the object stays the same (GradScaler keeps working)."""
    return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
