"""Step telemetry for Lightning: a ``Callback`` for ``lightning.pytorch`` or ``pytorch_lightning``.

    from traceml_otel.integrations.lightning_callback import TraceMLCallback     # lightning.pytorch
    trainer = L.Trainer(..., callbacks=[TraceMLCallback()])

    from traceml_otel.integrations.lightning_callback import PLTraceMLCallback   # pytorch_lightning

The callback calls ``traceml.init()`` (mode ``auto``) unless the program did, and opens one
``traceml.step`` span per optimizer update: from ``on_train_batch_start`` of its first batch to
``on_train_batch_end`` of the batch whose optimizer step ran. With ``accumulate_grad_batches=k`` the
step holds the update's k micro-batches (``traceml.phase.call`` 0..k-1); Lightning fetches micro-batches
2..k between them, so those fetches are inside the step (not input wait), as in a ``trace_step``
block around a whole update. Manual optimization (``automatic_optimization = False``): one step per
training batch.

Phases: ``forward`` is the strategy's ``training_step`` (your ``training_step``, loss included,
through the DDP wrapper when there is one), ``backward`` the strategy's ``backward``, and
``optimizer`` the ``LightningOptimizer.step()`` call; Lightning runs ``training_step`` and backward
inside that call (a closure), and those are their own spans: the optimizer span covers what follows
them (gradient clipping, ``on_before_optimizer_step``, the torch step). Validation and checkpoints run
between training batches, outside every step span, inside ``traceml.outside_step("evaluation")``
(from ``on_validation_start`` to ``on_validation_end``) and ``("checkpoint")`` (each
``trainer.save_checkpoint`` call); batches fetched for validation are not counted as the next
step's input wait.
"""

from __future__ import annotations

import importlib
from typing import Any

from traceml_otel.integrations._driver import StepDriver

_BUILT: dict[str, type] = {}


def _methods(package: str) -> dict[str, Any]:
    optimizer_module = importlib.import_module(f"{package}.core.optimizer")

    def __init__(self: Any, **init_kwargs: Any) -> None:
        """Args: ``**init_kwargs`` go to ``traceml.init()`` when the program has not called it."""
        self._driver = StepDriver(init_kwargs, source="lightning")
        self._driver.start()  # before the strategy wraps the model (DDP is then recognised)

    def setup(self: Any, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        driver = self._driver
        driver.start()
        strategy = trainer.strategy
        driver.time_forward(strategy, "training_step")
        driver.time_backward(strategy, "backward")
        driver.time_optimizer_class(optimizer_module.LightningOptimizer)
        driver.time_outside(trainer, "save_checkpoint", "checkpoint")

    def on_train_start(self: Any, trainer: Any, pl_module: Any) -> None:
        self._driver.resumed_at(getattr(trainer, "global_step", 0))  # restored from fit(ckpt_path=...)
        self._driver.forget_input_wait()  # the sanity check's validation batches

    def on_train_batch_start(self: Any, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._driver.in_step:  # else: a micro-batch of the update whose step is open
            self._driver.begin(pl_module)

    def on_train_batch_end(self: Any, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if getattr(pl_module, "automatic_optimization", True):
            self._driver.end_after_update(max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1)))
        else:  # manual optimization: the module steps its optimizers inside training_step
            self._driver.end()

    def on_train_epoch_end(self: Any, trainer: Any, pl_module: Any) -> None:
        self._driver.end()  # an update's window never spans epochs

    def on_validation_start(self: Any, trainer: Any, pl_module: Any) -> None:
        self._driver.end()  # validation between two micro-batches of one update stays outside steps
        self._driver.begin_outside("evaluation")

    def on_validation_end(self: Any, trainer: Any, pl_module: Any) -> None:
        self._driver.end_outside()

    def on_exception(self: Any, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._driver.in_step:
            self._driver.end(type(exception).__name__)
        self._driver.restore()

    def teardown(self: Any, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if self._driver.in_step:
            self._driver.end("IncompleteStep")
        self._driver.restore()

    return {name: value for name, value in locals().items() if callable(value) and name != "optimizer_module"}


def built_classes() -> tuple[type, ...]:
    """The callback classes built so far in this process (one per Lightning package name)."""
    return tuple(_BUILT.values())


def callback_class(package: str = "lightning.pytorch") -> type:
    """The callback class for ``package`` (``lightning.pytorch`` or ``pytorch_lightning``)."""
    if package not in _BUILT:
        base = importlib.import_module(package).Callback
        namespace = _methods(package)
        namespace["__doc__"] = f"Traces each training batch as one ``traceml.step`` ({package})."
        namespace["__module__"] = __name__
        _BUILT[package] = type("TraceMLCallback", (base,), namespace)
    return _BUILT[package]


def __getattr__(name: str) -> type:
    if name == "TraceMLCallback":
        return callback_class("lightning.pytorch")
    if name == "PLTraceMLCallback":
        return callback_class("pytorch_lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
